// The idle backstop of a stream's connection (http/routes.ts): Bun sweeps idle timers every 4 s,
// so a timeout of s seconds fires between 4 × (ceil(s / 4) − 1) and 4 × ceil(s / 4) seconds after
// it is armed. The backstop must never fire before the stream's own deadline and its error event.
import { describe, expect, test } from 'bun:test';
import { backstopSeconds, IDLE_SWEEP_S } from '../../src/http/routes.ts';

/** The earliest a Bun idle timeout of `seconds` may fire, in ms (see the header). */
function earliestFireMs(seconds: number): number {
  return IDLE_SWEEP_S * (Math.ceil(seconds / IDLE_SWEEP_S) - 1) * 1000;
}

describe('backstopSeconds', () => {
  test('fires at least 1 s after the wait, wherever the wait falls in a sweep', () => {
    // Every ms up to 4 sweeps, then the bounds near Bun's maximum of 255 s.
    const waits = [...Array.from({ length: 16_001 }, (_, ms) => ms), 60_000, 90_000, 243_000];
    for (const waitMs of waits) {
      const seconds = backstopSeconds(waitMs);
      expect({ waitMs, seconds: seconds > 0 && seconds <= 255 }).toEqual({ waitMs, seconds: true });
      expect({ waitMs, margin: earliestFireMs(seconds) - waitMs >= 1_000 }).toEqual({
        waitMs,
        margin: true,
      });
    }
  });

  test('exact multiples of the sweep keep their margin (4 s: 12 s, fires after 8 s)', () => {
    expect(backstopSeconds(4_000)).toBe(12);
    expect(backstopSeconds(3_000)).toBe(8);
    expect(backstopSeconds(90_000)).toBe(96);
  });

  test('off (0) once no timeout Bun allows can keep the margin', () => {
    // 252 s is the last whole sweep under 255: it may fire after 248 s.
    expect(backstopSeconds(247_000)).toBe(252);
    expect(backstopSeconds(247_001)).toBe(0);
    expect(backstopSeconds(3_600_000)).toBe(0);
  });
});
