// The count worker's entry, a thread of its own: serves CountPool's slices of count jobs. Never
// imported by the server itself.

import { runCountJob } from './count-jobs.ts';
import { serveSlices } from './count-pool.ts';

serveSlices(runCountJob);
