// JSON bodies bounded before they are parsed: nesting depth and value count are checked on the
// text, so no later step recurses too deep and no JSON.parse holds the event loop (CONTRACT §8).
import { GatewayError } from './errors.ts';

/**
 * Objects and arrays may nest this deep in a request body; deeper is refused before anything
 * recurses.
 */
export const JSON_DEPTH_MAX = 256;

/**
 * Object members a JSON text parsed on the event loop may hold in all. Members with distinct keys
 * are what JSON.parse is slowest at: ~100,000 (an ignored field of one object, or of 95 small ones)
 * held it ~100 ms, against CONTRACT §8's 50 at most. Room for what a request means: 2,048 messages
 * of a few fields each and 128 tools with their schemas come to ~20,000.
 */
export const JSON_MEMBERS_PARSED_MAX = 32_768;

/**
 * Bodies shorter than this cannot pass either bound of `scanJson` (each value or level takes 2
 * characters).
 */
const SCAN_FROM_CHARS = 2 * JSON_DEPTH_MAX;

/** Characters of the parser's message a malformed body's `detail` repeats. */
const PARSE_REASON_CHARS_MAX = 120;

/**
 * 400 invalid_request_error for malformed JSON, for JSON nested deeper than JSON_DEPTH_MAX (every
 * later step may recurse, and a stack overflow there would be a 500 for what is the client's
 * mistake), and for JSON holding more than `valuesMax` values (limits.max_body_json_values). Both
 * bounds are checked on the text before it is parsed: JSON.parse of 4 MB of tiny values (600,000
 * keys) holds the event loop for 150-200 ms, which no request may (CONTRACT §8), and its cost grows
 * faster than its size.
 */
export function parseJsonBody(
  text: string,
  valuesMax: number,
  membersMax = Number.POSITIVE_INFINITY,
): unknown {
  const over =
    text.length > SCAN_FROM_CHARS ? scanJson(text, valuesMax, JSON_DEPTH_MAX, membersMax) : null;
  if (over === 'members') {
    throw new GatewayError(
      'invalid_request_error',
      `The JSON body holds more than ${membersMax} object members.`,
      {
        param: null,
        detail: `the JSON objects of a request body may hold at most ${membersMax} members in all`,
      },
    );
  }
  if (over === 'depth') {
    throw new GatewayError(
      'invalid_request_error',
      `The JSON body nests deeper than ${JSON_DEPTH_MAX} levels.`,
      {
        param: null,
        detail: `JSON values may nest at most ${JSON_DEPTH_MAX} levels deep`,
      },
    );
  }
  if (over === 'values') {
    throw new GatewayError(
      'invalid_request_error',
      `The JSON body holds more than ${valuesMax} values.`,
      {
        param: null,
        detail: `a request body may hold at most ${valuesMax} JSON values`,
      },
    );
  }
  try {
    return JSON.parse(text);
  } catch (thrown) {
    // The parser's own words say what broke; they may quote a token of the body, so they are cut
    // short.
    const reason = String((thrown as Error)?.message).slice(0, PARSE_REASON_CHARS_MAX);
    throw new GatewayError('invalid_request_error', 'The body is not valid JSON.', {
      param: null,
      detail: `the body is not valid JSON (${reason})`,
    });
  }
}

/**
 * Counts a JSON text's values (containers and the elements after each comma) and its nesting,
 * outside strings, stopping at the first bound passed. Linear: strings are skipped with indexOf. A
 * malformed text gives some answer; JSON.parse then refuses it anyway.
 */
export function scanJson(
  text: string,
  valuesMax: number,
  depthMax: number,
  membersMax = Number.POSITIVE_INFINITY,
): 'values' | 'depth' | 'members' | null {
  const values = countJsonValues(text, valuesMax, depthMax, membersMax);
  if (values === DEPTH_PASSED) return 'depth';
  if (values === MEMBERS_PASSED) return 'members';
  return values > valuesMax ? 'values' : null;
}

/** What countJsonValues answers for a text nested deeper than its bound. */
export const DEPTH_PASSED = -1;
/** What countJsonValues answers for a text with an object of more than `membersMax` members. */
export const MEMBERS_PASSED = -2;

/**
 * The values of a JSON text as scanJson counts them; `valuesMax + 1` once past that bound,
 * DEPTH_PASSED once nested deeper than `depthMax`, MEMBERS_PASSED once the objects hold more than
 * `membersMax` members in all (each stops the scan there). Object members, with distinct keys, are
 * what JSON.parse is slowest at (99,000 in one object or in 95 of 1,024: ~40-50 ms alone, ~100 ms
 * in a busy gateway; as many strings in an array: half), so a caller on the event loop bounds them
 * apart from the values.
 */
export function countJsonValues(
  text: string,
  valuesMax: number,
  depthMax: number,
  membersMax = Number.POSITIVE_INFINITY,
): number {
  let values = 1;
  let depth = 0;
  // Per open container: 1 in an object, 0 in an array (only when members are bounded).
  const inObject = membersMax < valuesMax ? new Uint8Array(depthMax + 2) : null;
  let members = 0;
  const length = text.length;
  for (let i = 0; i < length; i++) {
    const c = text.charCodeAt(i);
    if (c === 34 /* " */) {
      // To the closing quote: the next one not escaped (preceded by an even run of backslashes).
      for (let from = i + 1; ; ) {
        const quote = text.indexOf('"', from);
        if (quote === -1) return values;
        let backslashes = 0;
        while (text.charCodeAt(quote - 1 - backslashes) === 92 /* \ */) backslashes++;
        from = quote + 1;
        if (backslashes % 2 === 0) {
          i = quote;
          break;
        }
      }
    } else if (c === 91 /* [ */ || c === 123 /* { */) {
      if (++depth > depthMax) return DEPTH_PASSED;
      if (++values > valuesMax) return values;
      if (inObject !== null) {
        inObject[depth] = c === 123 ? 1 : 0;
        // An object's first member (an empty one counts one too: close enough for a bound).
        if (c === 123 && ++members > membersMax) return MEMBERS_PASSED;
      }
    } else if (c === 93 /* ] */ || c === 125 /* } */) {
      depth--;
    } else if (c === 44 /* , */) {
      if (++values > valuesMax) return values;
      if (inObject !== null && inObject[depth] === 1 && ++members > membersMax)
        return MEMBERS_PASSED;
    }
  }
  return values;
}
