// Stop sequences the gateway enforces itself, for a provider that refuses them (the Messages API
// takes no stop sequence that is only whitespace, such as the common "\n"): the answer's text is
// cut where one begins and the answer ends there, as the provider would have stopped.
import { assert } from '../../util/assert.ts';
import type { Delta } from '../provider.ts';

export class StopCutter {
  /** A stop came: the answer ended before it, and nothing after it is relayed. */
  cut = false;
  private readonly stops: readonly string[];
  /**
   * Per stop, the Knuth–Morris–Pratt failure function: for each prefix, the length of its longest
   * proper prefix that is also its suffix. It makes finding a stop linear in the text, whatever
   * the stops are: a client's stop of 100,000 spaces costs its memory, not a scan per character.
   */
  private readonly failures: Int32Array[];
  /** Per stop, how many of its first characters the text relayed so far ends with. */
  private readonly matched: Int32Array;
  /** The longest stop's length. */
  private readonly stopCharsMax: number;
  private sawToolCall = false;

  constructor(stops: readonly string[]) {
    // The chat service refuses an empty stop; one here would match before every character.
    assert(
      stops.every((stop) => stop.length > 0),
      'an empty stop sequence',
    );
    this.stops = stops;
    this.failures = stops.map(failureFunction);
    this.matched = new Int32Array(stops.length);
    this.stopCharsMax = Math.max(...stops.map((stop) => stop.length));
  }

  /**
   * One read's deltas as they may be relayed: text that may begin a stop is held back (it follows
   * with the next text, or before the next delta of another kind); at a stop, the text before it is
   * kept and every delta after it dropped (`cut`: the answer ends with `finish`). A finish is
   * passed on after what was held back.
   */
  cutDeltas(deltas: readonly Delta[]): Delta[] {
    const out: Delta[] = [];
    if (this.cut) return out;
    for (const delta of deltas) {
      if (delta.type === 'text') {
        const text = this.push(delta.text);
        if (text.length > 0) out.push(text === delta.text ? delta : { type: 'text', text });
        if (this.cut) return out;
        continue;
      }
      const held = this.release();
      if (held.length > 0) out.push({ type: 'text', text: held });
      if (delta.type === 'tool_call') this.sawToolCall = true;
      out.push(delta);
    }
    return out;
  }

  /**
   * The finish of an answer cut at a stop, from what the provider said by then (`providerFinish`,
   * or null): its prompt count stands, its completion count does not (it counts what the provider
   * went on to generate past the stop), so the gateway counts what the client got.
   */
  finish(providerFinish: Delta | undefined): Delta {
    const usage = providerFinish?.type === 'finish' ? providerFinish.usage : null;
    return {
      type: 'finish',
      reason: this.sawToolCall ? 'tool_calls' : 'stop',
      usage: usage === null ? null : { promptTokens: usage.promptTokens, completionTokens: null },
    };
  }

  /** The text held back, for the end of the answer (or of its text): nothing more can follow it. */
  release(): string {
    const held = this.held();
    this.matched.fill(0);
    return held;
  }

  /**
   * The text relayed so far ends with the first `matched[i]` characters of stop i; the longest of
   * these is held back, and the others are suffixes of it.
   */
  private held(): string {
    let longest = 0;
    let stop = 0;
    for (let i = 0; i < this.matched.length; i++) {
      if (this.matched[i]! > longest) {
        longest = this.matched[i]!;
        stop = i;
      }
    }
    return longest === 0 ? '' : this.stops[stop]!.slice(0, longest);
  }

  /** What of `text` (after what was held back) may be relayed now. */
  private push(text: string): string {
    if (text.length === 0) return text;
    if (text.length >= WHOLE_SEARCH_CHARS && text.length >= this.stopCharsMax)
      return this.pushLong(text);
    const held = this.held();
    const stops = this.stops;
    const matched = this.matched;
    let longest = 0;
    for (let at = 0; at < text.length; at++) {
      const char = text.charCodeAt(at);
      longest = 0;
      for (let i = 0; i < stops.length; i++) {
        const stop = stops[i]!;
        const failure = this.failures[i]!;
        let length = matched[i]!;
        while (length > 0 && stop.charCodeAt(length) !== char) length = failure[length - 1]!;
        if (stop.charCodeAt(length) === char) length++;
        if (length === stop.length) {
          // The stop ends here (the first to end, as a provider checks after each token): what
          // comes before its first character is the answer.
          this.cut = true;
          matched.fill(0);
          const start = held.length + at + 1 - length;
          return start <= held.length
            ? held.slice(0, start)
            : held + text.slice(0, start - held.length);
        }
        matched[i] = length;
        if (length > longest) longest = length;
      }
    }
    if (held.length === 0 && longest === 0) return text;
    const release = held.length + text.length - longest;
    return release <= held.length
      ? held.slice(0, release)
      : held + text.slice(0, release - held.length);
  }

  /**
   * `push` for a text at least as long as every stop: each stop's first place by `indexOf`, then
   * how much of each the text ends with, scanned over its last characters only (a stop that is
   * not in the text can only begin in the last stop-length − 1 of them).
   */
  private pushLong(text: string): string {
    const all = this.held() + text;
    const stops = this.stops;
    const matched = this.matched;
    let end = -1;
    let length = 0;
    for (const stop of stops) {
      // The first to end wins, as in `push`; on a tie, the first listed.
      const at = all.indexOf(stop);
      if (at !== -1 && (end === -1 || at + stop.length < end)) {
        end = at + stop.length;
        length = stop.length;
      }
    }
    if (end !== -1) {
      this.cut = true;
      matched.fill(0);
      return all.slice(0, end - length);
    }
    let longest = 0;
    for (let i = 0; i < stops.length; i++) {
      const stop = stops[i]!;
      const failure = this.failures[i]!;
      let state = 0;
      for (let at = all.length - (stop.length - 1); at < all.length; at++) {
        const char = all.charCodeAt(at);
        while (state > 0 && stop.charCodeAt(state) !== char) state = failure[state - 1]!;
        if (stop.charCodeAt(state) === char) state++;
      }
      matched[i] = state;
      if (state > longest) longest = state;
    }
    return all.slice(0, all.length - longest);
  }
}

/**
 * A text this long (a whole answer, not a stream's delta) is searched natively: the scan above
 * costs ~4.5 ns a character a stop, 290 ms of event loop for a 16 MiB answer and four stops.
 */
const WHOLE_SEARCH_CHARS = 4_096;

function failureFunction(stop: string): Int32Array {
  const failure = new Int32Array(stop.length);
  let length = 0;
  for (let i = 1; i < stop.length; i++) {
    const char = stop.charCodeAt(i);
    while (length > 0 && stop.charCodeAt(length) !== char) length = failure[length - 1]!;
    if (stop.charCodeAt(length) === char) length++;
    failure[i] = length;
  }
  return failure;
}
