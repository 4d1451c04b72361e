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
  }

  /**
   * One read's deltas as they may be relayed: text that may begin a stop is held back (it follows
   * with the next text, or before the next delta of another kind); at a stop, the text before it is
   * kept, every delta after it dropped, and the answer finishes. A finish is passed on after what
   * was held back.
   */
  cutDeltas(deltas: readonly Delta[]): Delta[] {
    const out: Delta[] = [];
    if (this.cut) return out;
    for (const delta of deltas) {
      if (delta.type === 'text') {
        const text = this.push(delta.text);
        if (text.length > 0) out.push(text === delta.text ? delta : { type: 'text', text });
        if (!this.cut) continue;
        // The usage the provider reports counts what it went on to generate after the stop; the
        // gateway counts what the client got (as it does whenever no usage comes).
        out.push({ type: 'finish', reason: this.sawToolCall ? 'tool_calls' : 'stop', usage: null });
        return out;
      }
      const held = this.release();
      if (held.length > 0) out.push({ type: 'text', text: held });
      if (delta.type === 'tool_call') this.sawToolCall = true;
      out.push(delta);
    }
    return out;
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
}

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
