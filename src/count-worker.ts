// The count worker's entry, a thread of its own: serves CountPool's slices of count jobs. Never
// imported by the server itself. It sits at the top, beside main.ts (the other entrypoint of `bun
// run build`), because it runs every domain's jobs: billing's counts and a decision's large body.

import { type CountJob, runCountJob } from './billing/count-jobs.ts';
import { serveSlices } from './billing/count-pool.ts';
import { isDecisionBodyJob, runDecisionBodyJob } from './decision/count-job.ts';

serveSlices((job: CountJob) =>
  isDecisionBodyJob(job) ? runDecisionBodyJob(job) : runCountJob(job),
);
