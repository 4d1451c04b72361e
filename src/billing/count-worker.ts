// The count worker's entry, a thread of its own: serves CountPool's slices of count jobs. Never imported by the server itself.
import { serveSlices } from './count-pool.ts';
import { runCountJob } from './count-jobs.ts';

serveSlices(runCountJob);
