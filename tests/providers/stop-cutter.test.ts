// The stops the gateway enforces itself (a provider refused them): cut where the first one ends,
// held back only while the text may be the start of one.
import { describe, expect, test } from 'bun:test';
import { StopCutter } from '../../src/providers/http/stop-cutter.ts';
import type { Delta } from '../../src/providers/provider.ts';
import { SeededRandom } from '../../src/providers/simulator/random.ts';

const FINISH: Delta = {
  type: 'finish',
  reason: 'stop',
  usage: { promptTokens: 3, completionTokens: 9 },
};

/**
 * Integers below n from a seeded mulberry32, every bit well mixed (an LCG's low bits repeat, and
 * drew no stop over two characters).
 */
function randomBelow(seed: number): (n: number) => number {
  const random = new SeededRandom(seed);
  return (n) => random.integer(0, n - 1);
}

function text(value: string): Delta {
  return { type: 'text', text: value };
}

/** Feeds `pieces` one read each, then the provider's finish; returns what would be relayed. */
function relay(stops: string[], pieces: string[]): { text: string; deltas: Delta[] } {
  const cutter = new StopCutter(stops);
  const deltas: Delta[] = [];
  for (const piece of pieces) if (!cutter.cut) deltas.push(...cutter.cutDeltas([text(piece)]));
  deltas.push(...(cutter.cut ? [cutter.finish(FINISH)] : cutter.cutDeltas([FINISH])));
  const joined = deltas.map((delta) => (delta.type === 'text' ? delta.text : '')).join('');
  return { text: joined, deltas };
}

/** What a provider honouring the stops would answer: cut before the stop that ends first. */
function expected(stops: string[], whole: string): string {
  let end = -1;
  let start = -1;
  for (const stop of stops) {
    const at = whole.indexOf(stop);
    if (at !== -1 && (end === -1 || at + stop.length < end)) {
      end = at + stop.length;
      start = at;
    }
  }
  return start === -1 ? whole : whole.slice(0, start);
}

describe('StopCutter', () => {
  test('a stop inside one read: the text before it, then a finish with the prompt count', () => {
    const { text: relayed, deltas } = relay(['\n'], ['Hello\nthere']);
    expect(relayed).toBe('Hello');
    // The provider's completion count covers what it generated past the stop: the gateway counts
    // what was relayed instead. Its prompt count stands.
    expect(deltas.at(-1)).toEqual({
      type: 'finish',
      reason: 'stop',
      usage: { promptTokens: 3, completionTokens: null },
    });
    expect(new StopCutter([' ']).finish(undefined)).toEqual({
      type: 'finish',
      reason: 'stop',
      usage: null,
    });
  });

  test('a stop across reads is cut, and what might begin one waits only until it cannot', () => {
    const cutter = new StopCutter(['\n\n']);
    expect(cutter.cutDeltas([text('one\n')])).toEqual([text('one')]);
    // Not the stop after all: the held newline goes out with the next text.
    expect(cutter.cutDeltas([text('two\n')])).toEqual([text('\ntwo')]);
    expect(cutter.cutDeltas([text('\nthree')])).toEqual([]);
    expect(cutter.cut).toBe(true);
    // Nothing after the stop is relayed.
    expect(cutter.cutDeltas([text('more'), FINISH])).toEqual([]);
  });

  test('held text goes out before a delta of another kind, and before the finish', () => {
    const cutter = new StopCutter(['\n\n']);
    const call: Delta = { type: 'tool_call', index: 0, id: 'c', name: 'f', arguments: '{}' };
    expect(cutter.cutDeltas([text('a\n'), call, text('b\n'), FINISH])).toEqual([
      text('a'),
      text('\n'),
      call,
      text('b'),
      text('\n'),
      FINISH,
    ]);
  });

  test('a stop after a tool call finishes as tool_calls', () => {
    const cutter = new StopCutter([' ']);
    const call: Delta = { type: 'tool_call', index: 0, id: 'c', name: 'f', arguments: '{}' };
    expect(cutter.cutDeltas([call, text('x y')])).toEqual([call, text('x')]);
    expect(cutter.finish(FINISH)).toEqual({
      type: 'finish',
      reason: 'tool_calls',
      usage: { promptTokens: 3, completionTokens: null },
    });
  });

  test('without a stop the text is relayed whole and unchanged', () => {
    const pieces = ['Hello', ' ', 'there,', ' friend'];
    const cutter = new StopCutter(['\n']);
    for (const piece of pieces) {
      const [delta] = cutter.cutDeltas([text(piece)]);
      expect(delta).toEqual(text(piece));
    }
  });

  test('overlapping prefixes (KMP fallback) and several stops: the first to end wins', () => {
    expect(relay(['  \n'], [' ', ' ', ' ', '\nx']).text).toBe(' ');
    expect(relay(['\n\n\n', ' \n'], ['a\n\n', ' \n\n\n']).text).toBe('a\n\n');
    expect(relay(['\t\t', '\n'], ['a\t', 'b\n\t\tc']).text).toBe('a\tb');
  });

  test('any split of any text gives what a provider honouring the stops would', () => {
    const alphabet = [' ', '\n', '\t', 'a', 'b'];
    const random = randomBelow(7);
    const lengths = new Set<number>();
    for (let round = 0; round < 2000; round++) {
      const stops = Array.from({ length: 1 + random(3) }, () =>
        Array.from({ length: 1 + random(4) }, () => alphabet[random(3)]).join(''),
      );
      for (const stop of stops) lengths.add(stop.length);
      const whole = Array.from({ length: random(30) }, () => alphabet[random(5)]).join('');
      const pieces: string[] = [];
      for (let at = 0; at < whole.length; ) {
        const length = 1 + random(5);
        pieces.push(whole.slice(at, at + length));
        at += length;
      }
      expect({ stops, whole, relayed: relay(stops, pieces).text }).toEqual({
        stops,
        whole,
        relayed: expected(stops, whole),
      });
    }
    expect([...lengths].sort()).toEqual([1, 2, 3, 4]);
  });

  test('a whole answer (one long text) is cut as its reads would be, whatever the split', () => {
    // Long texts take a native search (WHOLE_SEARCH_CHARS), short ones the scan: mixed here.
    const random = randomBelow(11);
    const letters = 'abcdefghij';
    const blanks = [' ', '\n', '\t'];
    let cut = 0;
    for (let round = 0; round < 300; round++) {
      const stops = Array.from({ length: 1 + random(3) }, () =>
        Array.from({ length: 2 + random(5) }, () => blanks[random(3)]).join(''),
      );
      let whole = '';
      const wholeChars = 2_000 + random(20_000);
      while (whole.length < wholeChars)
        whole += random(6) === 0 ? blanks[random(3)] : letters[random(10)];
      const pieces: string[] = [];
      for (let at = 0; at < whole.length; ) {
        const length = random(3) === 0 ? 4_096 + random(8_000) : 1 + random(40);
        pieces.push(whole.slice(at, at + length));
        at += length;
      }
      const relayed = relay(stops, pieces).text;
      expect({ stops, relayed }).toEqual({ stops, relayed: expected(stops, whole) });
      if (relayed.length < whole.length) cut++;
    }
    // Both ends of it are met: answers cut, and answers without a stop.
    expect(cut).toBeGreaterThan(30);
    expect(cut).toBeLessThan(270);
  });

  test('a stop of 200,000 spaces against 200,000 one-space reads stays linear', () => {
    const stop = `${' '.repeat(199_999)}x`;
    const cutter = new StopCutter([stop]);
    let relayed = 0;
    const started = performance.now();
    for (let i = 0; i < 200_000; i++)
      for (const delta of cutter.cutDeltas([text(' ')]))
        if (delta.type === 'text') relayed += delta.text.length;
    // Only what cannot begin the stop went out (one space); the rest is held for what follows.
    expect(relayed).toBe(1);
    expect(cutter.release().length).toBe(199_999);
    // A quadratic scan would take minutes here; linear is milliseconds. Not a speed assertion:
    // a bound ten thousand times what it takes, so it fails only on the complexity.
    expect(performance.now() - started).toBeLessThan(20_000);
  });
});
