// The event-loop delay in /metrics sees a loop blocked by JavaScript (Bun's own monitor does not).
import { expect, test } from 'bun:test';
import { Metrics } from '../../src/ops/metrics.ts';

function nextTimer(): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, 25));
}

test(
  'a 120 ms block shows as the worst delay and ' + 'in the histogram; the max resets at the scrape',
  async () => {
    const metrics = new Metrics(() => 0);
    metrics.loopDelay.start();
    try {
      await nextTimer();
      const startMs = performance.now();
      while (performance.now() - startMs < 120) {
        // busy: the loop cannot run the monitor's timer
      }
      await nextTimer();
      await nextTimer();
      const text = (await metrics.expose()).text;
      const max = Number(/^tollgate_event_loop_delay_max_seconds (\S+)$/m.exec(text)?.[1]);
      expect(max).toBeGreaterThanOrEqual(0.09);
      expect(
        Number(/^tollgate_event_loop_delay_seconds_bucket\{le="0.05"\} (\S+)$/m.exec(text)?.[1]),
      ).toBeLessThan(
        Number(/^tollgate_event_loop_delay_seconds_bucket\{le="\+Inf"\} (\S+)$/m.exec(text)?.[1]),
      );
      const again = (await metrics.expose()).text;
      expect(
        Number(/^tollgate_event_loop_delay_max_seconds (\S+)$/m.exec(again)?.[1]),
      ).toBeLessThan(0.09);
    } finally {
      metrics.loopDelay.stop();
    }
  },
);
