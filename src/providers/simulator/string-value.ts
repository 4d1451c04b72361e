// Strings for a JSON Schema's `pattern` and `format`: a simulated tool call's arguments must
// validate (CONTRACT §7), and a `pattern: "^[A-Z]{3}$"` or a `format: "date"` is common in tool
// schemas (OpenAI's structured outputs support both).
//
// A pattern is turned into a string by construction, never by testing candidates against the
// regex: the pattern is the caller's, and running a hostile one (`(a|aa)+$`) on a string it does
// not match can hold the event loop for seconds. What is built is bounded in characters and steps.
// A minLength or maxLength beside the pattern is met by aiming the build at a length both allow.
// The ECMAScript syntax covered: literals and escapes, `.`, classes (ranges, negation, \d \w \s and
// their negations), groups (capturing, non-capturing, named), alternation, every quantifier, the
// anchors ^ and $. Lookaround, backreferences and \b are not: such a pattern gets null (the caller
// uses a plain word, which may then not match).
import type { SeededRandom } from './random.ts';

/** A pattern longer than this is not read: null, as an unsupported one. */
const PATTERN_CHARS_MAX = 1024;
/** Parsed nodes of one pattern, at most. */
const PATTERN_NODES_MAX = 1024;
/** Repetitions an unbounded quantifier (`*`, `+`, `{n,}`) adds past its minimum, at most. */
const REPEAT_EXTRA_MAX = 3;
/** Varied builds aimed at a length allowed by minLength and maxLength, before the plain ones. */
const LENGTH_ATTEMPTS_MAX = 4;
/** Plain builds then: at the least length, one more and two more, each with fewer, then more. */
const PLAIN_ATTEMPTS_MAX = 6;
/**
 * A build's node visits per step of the caller's budget (a schema node costs about as much as
 * this many of them; a visit of a build aimed at a length, up to ~0.3 µs): a long array may build
 * its item's pattern once per item, and a hostile pattern repeats a group many times over.
 */
export const PATTERN_STEPS_PER_STEP = 4;
/**
 * What parsing a pattern costs the caller's budget, in its steps: a base and one per so many of
 * its characters. Parsing it and working out its classes cost ~8-15 µs for a pattern of 30-90
 * characters, 25-40 steps' worth at ~0.4 µs a step; charged 1 step a visit, 1,536 pattern-bearing
 * properties held the event loop 30-60 ms within the search's steps (audit J).
 */
const PATTERN_PARSE_STEPS = 8;
const PATTERN_CHARS_PER_STEP = 2;

/**
 * How many code points a node can make, at the least and the most (Infinity when unbounded):
 * JSON Schema's minLength and maxLength count code points, and each text or class node makes one.
 */
interface Lengths {
  lo: number;
  hi: number;
}

const ONE: Lengths = { lo: 1, hi: 1 };

type TextNode = { kind: 'text'; char: string };
type SetNode = { kind: 'set'; ranges: Array<[number, number]>; negated: boolean };
/** A group or the whole pattern: its branches and what each can make. */
interface AltNode {
  kind: 'alt';
  branches: Node[][];
  branchLengths: Lengths[];
  lengths: Lengths;
  /** The branch that makes the fewest code points (the first of them). */
  shortest: number;
  /**
   * The whole pattern only: no `$` in it, so whatever follows a match keeps it a match (JSON
   * Schema patterns are not anchored): a string too short for minLength may be padded.
   */
  openEnd?: boolean;
}
interface RepeatNode {
  kind: 'repeat';
  node: Node;
  min: number;
  max: number;
  lengths: Lengths;
}
type Node = TextNode | SetNode | AltNode | RepeatNode;

function lengthsOf(node: Node): Lengths {
  return node.kind === 'alt' || node.kind === 'repeat' ? node.lengths : ONE;
}

function sequenceLengths(nodes: Node[]): Lengths {
  let lo = 0;
  let hi = 0;
  for (const node of nodes) {
    const lengths = lengthsOf(node);
    lo += lengths.lo;
    hi += lengths.hi;
  }
  return { lo, hi };
}

function altNode(branches: Node[][]): AltNode {
  const branchLengths = branches.map(sequenceLengths);
  let shortest = 0;
  let hi = 0;
  for (let i = 0; i < branchLengths.length; i++) {
    if (branchLengths[i]!.lo < branchLengths[shortest]!.lo) shortest = i;
    hi = Math.max(hi, branchLengths[i]!.hi);
  }
  const lo = branchLengths[shortest]!.lo;
  return { kind: 'alt', branches, branchLengths, lengths: { lo, hi }, shortest };
}

function repeatNode(node: Node, min: number, max: number): RepeatNode {
  const child = lengthsOf(node);
  // Nothing repeated, or a child that makes nothing: nothing (0 × Infinity would be NaN).
  const hi = max === 0 || child.hi === 0 ? 0 : max * child.hi;
  return { kind: 'repeat', node, min, max, lengths: { lo: min * child.lo, hi } };
}

/** Why a pattern cannot be built (caught at the entry point). */
class Unsupported extends Error {}
/** The pattern's string does not fit in the characters allowed. */
class TooLong extends Unsupported {}

const DIGIT: Array<[number, number]> = [[0x30, 0x39]];
const WORD: Array<[number, number]> = [
  [0x30, 0x39],
  [0x41, 0x5a],
  [0x5f, 0x5f],
  [0x61, 0x7a],
];
const SPACE: Array<[number, number]> = [
  [0x09, 0x0d],
  [0x20, 0x20],
  [0xa0, 0xa0],
  [0xfeff, 0xfeff],
];
/** What `.` and a negated class choose from first: printable ASCII, letters before the rest. */
const ASCII_CODES = 128;
const PRINTABLE: Array<[number, number]> = [
  [0x61, 0x7a],
  [0x41, 0x5a],
  [0x30, 0x39],
  [0x20, 0x2f],
  [0x3a, 0x40],
  [0x5b, 0x60],
  [0x7b, 0x7e],
];

/** `\d`, `\w`, `\s`; their capitals are the negations. */
const CLASS_ESCAPES = new Map([
  ['d', DIGIT],
  ['w', WORD],
  ['s', SPACE],
]);
const CONTROL_ESCAPES = new Map([
  ['t', '\t'],
  ['n', '\n'],
  ['r', '\r'],
  ['f', '\f'],
  ['v', '\v'],
  ['0', '\0'],
]);

/** Parses the subset of ECMAScript regex syntax above; throws Unsupported past it. */
class PatternParser {
  private at = 0;
  private nodes = 0;
  /** A `$` came (anywhere: a branch's end anchor is enough to make padding unsafe). */
  private endAnchored = false;

  constructor(private readonly source: string) {}

  parse(): AltNode {
    const branches = this.alternation();
    if (this.at < this.source.length) throw new Unsupported('unbalanced )');
    const root = altNode(branches);
    root.openEnd = !this.endAnchored;
    return root;
  }

  private count(): void {
    if (++this.nodes > PATTERN_NODES_MAX) throw new Unsupported('too many nodes');
  }

  private alternation(): Node[][] {
    const branches: Node[][] = [this.sequence()];
    while (this.source[this.at] === '|') {
      this.at++;
      branches.push(this.sequence());
    }
    return branches;
  }

  private sequence(): Node[] {
    const nodes: Node[] = [];
    while (this.at < this.source.length) {
      const char = this.source[this.at]!;
      if (char === '|' || char === ')') break;
      if (char === '^' || char === '$') {
        // The string built is the match itself, from its start to its end: anchors hold.
        if (char === '$') this.endAnchored = true;
        this.at++;
        continue;
      }
      const atom = this.atom();
      nodes.push(this.quantified(atom));
    }
    return nodes;
  }

  private atom(): Node {
    this.count();
    const char = this.source[this.at++]!;
    switch (char) {
      case '(':
        return this.group();
      case '[':
        return this.set();
      case '.':
        return { kind: 'set', ranges: [[0x0a, 0x0a]], negated: true };
      case '\\':
        return this.escape(false);
      case '*':
      case '+':
      case '?':
      case '{':
        // A quantifier with nothing before it; `{` alone is a literal in non-unicode patterns.
        if (char === '{' && !/^\d+(,\d*)?\}/.test(this.source.slice(this.at)))
          return { kind: 'text', char };
        throw new Unsupported('a quantifier with nothing to repeat');
      default:
        return { kind: 'text', char: this.codePointAt(char) };
    }
  }

  /** `char` plus its low surrogate when it opens a pair: one character of the pattern. */
  private codePointAt(char: string): string {
    const code = char.charCodeAt(0);
    if (code >= 0xd800 && code <= 0xdbff && this.at < this.source.length) {
      const low = this.source.charCodeAt(this.at);
      if (low >= 0xdc00 && low <= 0xdfff) {
        this.at++;
        return char + this.source[this.at - 1];
      }
    }
    return char;
  }

  private group(): Node {
    if (this.source[this.at] === '?') {
      const kind = this.source.slice(this.at, this.at + 3);
      if (kind.startsWith('?:')) this.at += 2;
      else if (kind.startsWith('?<') && kind !== '?<=' && kind !== '?<!') {
        const end = this.source.indexOf('>', this.at);
        if (end === -1) throw new Unsupported('unterminated group name');
        this.at = end + 1;
      } else throw new Unsupported('lookaround');
    }
    const branches = this.alternation();
    if (this.source[this.at] !== ')') throw new Unsupported('unterminated group');
    this.at++;
    return altNode(branches);
  }

  private set(): Node {
    const negated = this.source[this.at] === '^';
    if (negated) this.at++;
    const ranges: Array<[number, number]> = [];
    // In ECMAScript `]` always closes a class: `[]` matches nothing, `[^]` any character.
    while (this.at < this.source.length && this.source[this.at] !== ']') {
      this.count();
      const low = this.setMember(ranges);
      if (low === null) continue;
      if (
        this.source[this.at] === '-' &&
        this.source[this.at + 1] !== ']' &&
        this.at + 1 < this.source.length
      ) {
        this.at++;
        const high = this.setMember(ranges);
        if (high === null) {
          // `[\d-z]`: the dash is a literal.
          ranges.push([low, low], [0x2d, 0x2d]);
          continue;
        }
        if (high < low) throw new Unsupported('range out of order');
        ranges.push([low, high]);
      } else ranges.push([low, low]);
    }
    if (this.source[this.at] !== ']') throw new Unsupported('unterminated class');
    this.at++;
    return { kind: 'set', ranges, negated };
  }

  /** One member of a class: its code point, or null when it was a class escape (added already). */
  private setMember(ranges: Array<[number, number]>): number | null {
    const char = this.source[this.at++]!;
    if (char !== '\\') return this.codePointAt(char).codePointAt(0)!;
    const escaped = this.escape(true);
    if (escaped.kind === 'text') return escaped.char.codePointAt(0)!;
    if (escaped.kind !== 'set' || escaped.negated) throw new Unsupported('negated escape in class');
    for (const range of escaped.ranges) ranges.push(range);
    return null;
  }

  private escape(inSet: boolean): Node {
    const char = this.source[this.at++];
    if (char === undefined) throw new Unsupported('trailing backslash');
    const ranges = CLASS_ESCAPES.get(char.toLowerCase());
    if (ranges !== undefined) return { kind: 'set', ranges, negated: char !== char.toLowerCase() };
    const control = CONTROL_ESCAPES.get(char);
    if (control !== undefined) return { kind: 'text', char: control };
    switch (char) {
      case 'b':
        if (inSet) return { kind: 'text', char: '\b' };
        throw new Unsupported('word boundary');
      case 'B':
        if (inSet) return { kind: 'text', char: 'B' };
        throw new Unsupported('non-word boundary');
      case 'x':
        return { kind: 'text', char: String.fromCharCode(this.hex(2)) };
      case 'u': {
        if (this.source[this.at] === '{') {
          const end = this.source.indexOf('}', this.at);
          if (end === -1) throw new Unsupported('unterminated \\u{');
          const digits = this.source.slice(this.at + 1, end);
          this.at = end + 1;
          // Hex digits only: parseInt would read "-1" or "+1" (and fromCodePoint throw on -1).
          if (!/^[0-9a-fA-F]{1,6}$/.test(digits)) throw new Unsupported('bad \\u{');
          const code = Number.parseInt(digits, 16);
          if (code > 0x10ffff) throw new Unsupported('bad \\u{');
          return { kind: 'text', char: String.fromCodePoint(code) };
        }
        const code = this.hex(4);
        // `\uD83D\uDE00` is one character, as the `u` flag reads it (Ajv compiles with it).
        const lowHex = this.source.slice(this.at + 2, this.at + 6);
        if (
          code >= 0xd800 &&
          code <= 0xdbff &&
          this.source.startsWith('\\u', this.at) &&
          /^[dD][c-fC-F][0-9a-fA-F]{2}$/.test(lowHex)
        ) {
          this.at += 6;
          return { kind: 'text', char: String.fromCharCode(code, Number.parseInt(lowHex, 16)) };
        }
        return { kind: 'text', char: String.fromCharCode(code) };
      }
      case 'c': {
        const letter = this.source.charCodeAt(this.at++);
        return { kind: 'text', char: String.fromCharCode(letter % 32) };
      }
      default:
        // Backreferences (\1, \k<name>) and property escapes (\p{…}) are not built.
        if (/[1-9kpP]/.test(char)) throw new Unsupported('backreference or property escape');
        return { kind: 'text', char };
    }
  }

  private hex(digits: number): number {
    const text = this.source.slice(this.at, this.at + digits);
    if (!new RegExp(`^[0-9a-fA-F]{${digits}}$`).test(text)) throw new Unsupported('bad hex escape');
    this.at += digits;
    return Number.parseInt(text, 16);
  }

  private quantified(atom: Node): Node {
    const char = this.source[this.at];
    let min: number;
    let max: number;
    if (char === '*') [min, max] = [0, Number.POSITIVE_INFINITY];
    else if (char === '+') [min, max] = [1, Number.POSITIVE_INFINITY];
    else if (char === '?') [min, max] = [0, 1];
    else if (char === '{') {
      const bounds = /^\{(\d+)(,(\d*))?\}/.exec(this.source.slice(this.at));
      if (bounds === null) return atom; // a literal `{`, read as the next atom
      min = Number(bounds[1]);
      max =
        bounds[2] === undefined ? min : bounds[3] ? Number(bounds[3]) : Number.POSITIVE_INFINITY;
      if (max < min) throw new Unsupported('quantifier out of order');
      this.at += bounds[0].length - 1;
    } else return atom;
    this.at++;
    if (this.source[this.at] === '?') this.at++; // lazy: the same strings match
    return repeatNode(atom, min, max);
  }
}

/**
 * Parsed patterns by the schema node that holds them: an array's items are built from one node
 * many times, and the parse lives as long as the request's schema, shared with no other request
 * (a process-wide memo would be one a key could fill for everyone).
 */
const parsedByNode = new WeakMap<object, AltNode | null>();

function parsePattern(node: object, pattern: string): AltNode | null {
  let branches = parsedByNode.get(node);
  if (branches !== undefined) return branches;
  branches = null;
  if (pattern.length <= PATTERN_CHARS_MAX) {
    try {
      branches = new PatternParser(pattern).parse();
    } catch (error) {
      if (!(error instanceof Unsupported)) throw error;
    }
  }
  parsedByNode.set(node, branches);
  return branches;
}

/**
 * Builds strings of a parsed pattern; `random` null builds the shortest (first choices). A build
 * may aim at a length (`target`, in code points): each alternation takes a branch that can make
 * it, each repeat a count that can, and a sequence shares it out so that what follows can still
 * make the rest.
 */
class PatternBuilder {
  private out = '';
  /** Code points built so far (each text and class node makes one). */
  points = 0;
  /**
   * When no count of a repeat or branch of an alternation makes its length exactly (`(ab)+` for
   * 3): more (4) rather than fewer (2). Fewer leaves what follows the rest to make; more reaches a
   * minimum on its own.
   */
  more = false;
  private charsLeft = 0;

  constructor(
    /** Null makes the first choices (the last attempts at a length set it). */
    public random: SeededRandom | null,
    private readonly charsMax: number,
    /** Node visits left, over every build; what remains is the caller's to read. */
    public stepsLeft: number,
  ) {}

  /** A string of `root`, `target` code points long if its lengths allow, or why there is none. */
  build(root: AltNode, target: number | null): string | Unsupported {
    this.out = '';
    this.points = 0;
    this.charsLeft = this.charsMax;
    try {
      this.alternation(root, target);
    } catch (error) {
      if (error instanceof Unsupported) return error;
      throw error;
    }
    return this.out;
  }

  private alternation(node: AltNode, target: number | null): void {
    const index = target === null ? this.anyBranch(node) : this.branchFor(node, target);
    const nodes = node.branches[index]!;
    if (target === null) {
      for (const child of nodes) this.node(child, null);
      return;
    }
    const { lo, hi } = node.branchLengths[index]!;
    this.sequence(nodes, Math.min(Math.max(target, lo), hi));
  }

  /** A random branch; the shortest without random. */
  private anyBranch(node: AltNode): number {
    if (this.random === null) return node.shortest;
    return this.random.integer(0, node.branches.length - 1);
  }

  /**
   * One of the branches that can make `target` code points, each as likely (the first without
   * random); else the nearest longer or shorter one (`more`).
   */
  private branchFor(node: AltNode, target: number): number {
    // Each branch looked at is a visit: `(?:|||…){n}` must not look at a thousand per repetition
    // for free.
    this.stepsLeft -= node.branches.length;
    if (this.stepsLeft < 0) throw new Unsupported('too much work');
    let chosen = -1;
    let fitting = 0;
    // When none can: the nearest longer one and the nearest shorter one.
    let longer = -1;
    let shorter = -1;
    for (let i = 0; i < node.branches.length; i++) {
      const { lo, hi } = node.branchLengths[i]!;
      if (lo <= target && target <= hi) {
        fitting++;
        // Reservoir sampling: the i-th fitting branch replaces the choice with chance 1/i.
        if (chosen === -1 || (this.random !== null && this.random.integer(1, fitting) === 1))
          chosen = i;
      } else if (lo > target) {
        if (longer === -1 || lo < node.branchLengths[longer]!.lo) longer = i;
      } else if (shorter === -1 || hi > node.branchLengths[shorter]!.hi) shorter = i;
    }
    if (chosen !== -1) return chosen;
    // More reaches a minimum on its own; fewer leaves the rest to what follows (see `more`).
    if (this.more) return longer !== -1 ? longer : shorter;
    return shorter !== -1 ? shorter : longer;
  }

  /**
   * `nodes` one after the other, `target` code points in all: each takes a share that leaves the
   * ones after it a length they can make, counted from what was really built (a `(ab)+` makes
   * only even lengths, and the next node makes up for it).
   */
  private sequence(nodes: Node[], target: number): void {
    const start = this.points;
    let loAfter = 0;
    let roomAfter = 0;
    let unboundedAfter = 0;
    for (const node of nodes) {
      const { lo, hi } = lengthsOf(node);
      loAfter += lo;
      if (hi === Number.POSITIVE_INFINITY) unboundedAfter++;
      else roomAfter += hi - lo;
    }
    for (const node of nodes) {
      const { lo, hi } = lengthsOf(node);
      loAfter -= lo;
      if (hi === Number.POSITIVE_INFINITY) unboundedAfter--;
      else roomAfter -= hi - lo;
      // What this node may add past its least, and must, so that the rest can make the remainder.
      const slack = target - (this.points - start) - loAfter - lo;
      const least = Math.max(0, unboundedAfter > 0 ? 0 : slack - roomAfter);
      const most = Math.max(least, Math.min(slack, hi - lo));
      const extra =
        this.random === null || least === most ? least : this.random.integer(least, most);
      this.node(node, lo + extra);
    }
  }

  private node(node: Node, target: number | null): void {
    if (--this.stepsLeft < 0) throw new Unsupported('too much work');
    if (node.kind === 'text') this.emit(node.char);
    else if (node.kind === 'set') this.emit(this.member(node));
    else if (node.kind === 'alt') this.alternation(node, target);
    else this.repeat(node, target);
  }

  private repeat(node: RepeatNode, target: number | null): void {
    const child = lengthsOf(node.node);
    // What makes nothing makes nothing however often: not built at all (`(?:|){300000}`); nor is
    // a child's shortest string when it is empty (the shortest of `((a?){300}){300}b` is "b").
    if (child.hi === 0) return;
    if (child.lo === 0 && (target === 0 || (target === null && this.random === null))) return;
    const times = target === null ? this.anyTimes(node) : this.timesFor(node, target);
    if (times * child.lo > this.charsLeft) throw new TooLong('too long');
    if (target === null) {
      for (let i = 0; i < times; i++) this.node(node.node, null);
      return;
    }
    const start = this.points;
    for (let i = 0; i < times; i++) {
      const after = times - i - 1;
      const left = target - (this.points - start);
      // An even share, within what leaves the repetitions after this one a length they can make.
      const share = Math.ceil(left / (after + 1));
      const least = after === 0 ? left : left - after * child.hi;
      const most = after === 0 ? left : left - after * child.lo;
      this.node(node.node, Math.min(Math.max(share, least), most));
    }
  }

  /** A count past the minimum, at most REPEAT_EXTRA_MAX more; the minimum without random. */
  private anyTimes(node: RepeatNode): number {
    const extra = Math.min(node.max - node.min, REPEAT_EXTRA_MAX);
    return node.min + (this.random === null || extra === 0 ? 0 : this.random.integer(0, extra));
  }

  /** A count whose repetitions can make `target` code points. */
  private timesFor(node: RepeatNode, target: number): number {
    // The child makes something (repeat() builds nothing of one that cannot).
    const { lo, hi } = lengthsOf(node.node);
    let low = node.min;
    let high = node.max;
    if (hi !== Number.POSITIVE_INFINITY) low = Math.max(low, Math.ceil(target / hi));
    else if (target > 0) low = Math.max(low, 1);
    if (lo > 0) high = Math.min(high, Math.floor(target / lo));
    if (low > high)
      return this.more
        ? Math.min(Math.max(low, node.min), node.max)
        : Math.max(node.min, Math.min(high, node.max));
    if (this.random === null) return low;
    return this.random.integer(low, Math.min(high, low + REPEAT_EXTRA_MAX));
  }

  private emit(text: string): void {
    this.charsLeft -= text.length;
    if (this.charsLeft < 0) throw new TooLong('too long');
    this.out += text;
    this.points++;
  }

  /** A character of the class: picked from its choices, worked out once per class (choicesOf). */
  private member(node: SetNode): string {
    const choices = choicesOf(node);
    const { printable } = choices;
    if (printable.length > 0)
      return printable[this.random === null ? 0 : this.random.integer(0, printable.length - 1)]!;
    if (choices.other === null) throw new Unsupported('a class that matches nothing');
    return choices.other;
  }
}

interface SetChoices {
  /** The printable ASCII characters the class matches, letters first (one string, not a list). */
  printable: string;
  /** Else one character it matches (the lowest), or null when it matches none. */
  other: string | null;
}

const setChoices = new WeakMap<SetNode, SetChoices>();

/**
 * What a class may yield, worked out once per class node: its ranges merged and sorted, the ASCII
 * codes they cover marked, then the 95 printable characters read off the marks. A class of
 * thousands of members is then a lookup per character built, not a scan (a `[^…]{n}` of 4,000
 * members took seconds); and a class costs ~100 array reads, not 95 binary searches and a string
 * of 95 pieces (a schema of 1,536 patterns spent a quarter of its search here: bench/README).
 */
function choicesOf(node: SetNode): SetChoices {
  let choices = setChoices.get(node);
  if (choices !== undefined) return choices;
  const merged = mergeRanges(node.ranges);
  const marked = new Uint8Array(ASCII_CODES);
  for (const [low, high] of merged) marked.fill(1, low, Math.min(high + 1, ASCII_CODES));
  const wanted = node.negated ? 0 : 1;
  const codes: number[] = [];
  for (const [low, high] of PRINTABLE)
    for (let code = low; code <= high; code++) if (marked[code] === wanted) codes.push(code);
  const printable = String.fromCharCode(...codes);
  let other: string | null = null;
  if (printable.length === 0) {
    if (!node.negated) {
      const first = merged[0];
      other = first === undefined ? null : String.fromCodePoint(first[0]);
    } else {
      // The lowest code point outside every range: 0, or just past the range that covers it.
      let code = 0;
      for (const [low, high] of merged) {
        if (code < low) break;
        code = Math.max(code, high + 1);
      }
      other = code <= 0x10ffff ? String.fromCodePoint(code) : null;
    }
  }
  choices = { printable, other };
  setChoices.set(node, choices);
  return choices;
}

function mergeRanges(ranges: Array<[number, number]>): Array<[number, number]> {
  const sorted = ranges.toSorted((a, b) => a[0] - b[0]);
  const merged: Array<[number, number]> = [];
  for (const [low, high] of sorted) {
    const last = merged[merged.length - 1];
    if (last !== undefined && low <= last[1] + 1) last[1] = Math.max(last[1], high);
    else merged.push([low, high]);
  }
  return merged;
}

/**
 * `built` made long enough for `lengthMin` when the pattern leaves its end open (no `$`): what
 * follows a match keeps it one. Letters, one code point each.
 */
function padded(
  built: string | Unsupported,
  builder: PatternBuilder,
  root: AltNode,
  lengthMin: number,
  charsMax: number,
): string | Unsupported {
  if (built instanceof Unsupported || !root.openEnd || builder.points >= lengthMin) return built;
  const missing = lengthMin - builder.points;
  if (built.length + missing > charsMax) return new TooLong('too long');
  builder.points = lengthMin;
  return built + 'x'.repeat(missing);
}

/** stringForPattern's answer when the pattern's shortest string does not fit the characters. */
export const PATTERN_TOO_LONG = Symbol('pattern too long');

/**
 * A string matching `pattern` (ECMAScript, unanchored as JSON Schema reads it), the pattern of
 * schema node `node`, of `lengthMin` to `lengthMax` code points and at most `charsMax` characters:
 * varied with `random`, the shortest without. PATTERN_TOO_LONG when no string of the pattern
 * fits `charsMax`; null when the pattern uses syntax not covered, needs more steps, or no string
 * of it was found within the lengths. `charge` is told the steps of the caller's budget the
 * builds took (PATTERN_STEPS_PER_STEP node visits each), at most `stepsMax`, and may throw to
 * stop the caller.
 */
export function stringForPattern(
  node: object,
  pattern: string,
  random: SeededRandom | null,
  lengthMin: number,
  lengthMax: number,
  charsMax: number,
  stepsMax: number,
  charge: (steps: number) => void,
): string | typeof PATTERN_TOO_LONG | null {
  if (!parsedByNode.has(node))
    charge(PATTERN_PARSE_STEPS + Math.ceil(pattern.length / PATTERN_CHARS_PER_STEP));
  const root = parsePattern(node, pattern);
  if (root === null) return null;
  const visitsMax = Math.max(0, stepsMax) * PATTERN_STEPS_PER_STEP;
  const builder = new PatternBuilder(random, charsMax, visitsMax);
  let built = padded(builder.build(root, null), builder, root, lengthMin, charsMax);
  const fits = () => builder.points >= lengthMin && builder.points <= lengthMax;
  if (!(built instanceof Unsupported) ? !fits() : built instanceof TooLong) {
    // Out of the lengths (or too long as built freely): aimed at a length both allow. A share of
    // it may miss (`(\.\d+)?` cannot make 1), so a few varied attempts, then the first choices
    // (the least early, the rest left to the end) aimed at the least length, one more, two more:
    // each with fewer repetitions and shorter branches where none makes the length, then more.
    const low = Math.max(lengthMin, root.lengths.lo);
    const high = Math.min(lengthMax, root.lengths.hi);
    const varied = random === null ? 0 : LENGTH_ATTEMPTS_MAX;
    built = new Unsupported('no string of the pattern has an allowed length');
    for (let attempt = 0; low <= high && attempt < varied + PLAIN_ATTEMPTS_MAX; attempt++) {
      builder.random = attempt < varied ? random : null;
      builder.more = attempt % 2 === 1;
      const target =
        builder.random === null
          ? Math.min(high, low + ((attempt - varied) >> 1))
          : builder.random.integer(low, Math.min(high, low + REPEAT_EXTRA_MAX));
      built = padded(builder.build(root, target), builder, root, lengthMin, charsMax);
      if (!(built instanceof Unsupported) && fits()) break;
      if (builder.stepsLeft < 0) break;
      if (!(built instanceof Unsupported)) built = new Unsupported('no string within the lengths');
    }
  }
  // A build that ran out charges all it was allowed, and one more: the caller's budget is spent.
  charge(
    builder.stepsLeft < 0
      ? stepsMax + 1
      : Math.ceil((visitsMax - builder.stepsLeft) / PATTERN_STEPS_PER_STEP),
  );
  if (built instanceof TooLong) return PATTERN_TOO_LONG;
  return built instanceof Unsupported ? null : built;
}

/** Words of generated strings (schema-value.ts uses them too): ASCII, a JSON byte per char. */
export const WORDS = [
  'alpha',
  'bravo',
  'delta',
  'echo',
  'river',
  'stone',
  'maple',
  'cedar',
  'amber',
  'coral',
];

function pad(value: number, width: number): string {
  return String(value).padStart(width, '0');
}

/**
 * A string of JSON Schema `format` (the formats of draft 2020-12 and OpenAI's structured outputs):
 * varied with `random`, a fixed one without; null for a format not known here. Formats with a
 * free part (an email's local part, a hostname's labels, a URI's path) grow it to `lengthMin`
 * characters; the others have the length they have.
 */
export function stringForFormat(
  format: string,
  random: SeededRandom | null,
  lengthMin = 0,
): string | null {
  const pick = (low: number, high: number) => (random === null ? low : random.integer(low, high));
  const word = () => WORDS[pick(0, WORDS.length - 1)]!;
  /** A word, grown with letters so that `around` characters more make `lengthMin`. */
  const free = (around: number) => {
    const text = word();
    return text + 'x'.repeat(Math.max(0, lengthMin - around - text.length));
  };
  const date = () => `${pick(2020, 2029)}-${pad(pick(1, 12), 2)}-${pad(pick(1, 28), 2)}`;
  const time = () => `${pad(pick(0, 23), 2)}:${pad(pick(0, 59), 2)}:${pad(pick(0, 59), 2)}Z`;
  switch (format) {
    case 'date':
      return date();
    case 'time':
      return time();
    case 'date-time':
      return `${date()}T${time()}`;
    case 'duration':
      return `P${pick(1, 30)}D`;
    case 'email':
    case 'idn-email':
      return `${free(EXAMPLE_DOMAIN.length + 1)}@${EXAMPLE_DOMAIN}`;
    case 'hostname':
    case 'idn-hostname':
      return hostname(word(), lengthMin);
    case 'ipv4':
      return `192.0.2.${pick(1, 254)}`;
    case 'ipv6':
      return `2001:db8::${pick(1, 0xffff).toString(16)}`;
    case 'uri':
    case 'iri':
    case 'url':
      return `https://${EXAMPLE_DOMAIN}/${free(EXAMPLE_DOMAIN.length + 9)}`;
    case 'uri-reference':
    case 'iri-reference':
    case 'json-pointer':
      return `/${free(1)}`;
    case 'uri-template':
      return `https://${EXAMPLE_DOMAIN}/{${free(EXAMPLE_DOMAIN.length + 11)}}`;
    case 'uuid': {
      let hex = '';
      for (let i = 0; i < 32; i++) hex += pick(0, 15).toString(16);
      // Version 4, variant 10xx: what a generated UUID looks like.
      const variant = '89ab'[pick(0, 3)];
      return (
        `${hex.slice(0, 8)}-${hex.slice(8, 12)}-4${hex.slice(13, 16)}-` +
        `${variant}${hex.slice(17, 20)}-${hex.slice(20)}`
      );
    }
    case 'relative-json-pointer':
      return '0';
    case 'regex':
      return `^${free(2)}$`;
    default:
      return null;
  }
}

const EXAMPLE_DOMAIN = 'example.com';
/** A hostname's longest label, and the longest hostname (RFC 1123). */
const LABEL_CHARS_MAX = 63;
const HOSTNAME_CHARS_MAX = 253;

/**
 * `first`.example.com, or, to reach `lengthMin` (up to a hostname's 253 characters), labels of at
 * most 63 letters before example.com, the first starting with `first`.
 */
function hostname(first: string, lengthMin: number): string {
  const suffix = `.${EXAMPLE_DOMAIN}`;
  const room = Math.min(lengthMin, HOSTNAME_CHARS_MAX) - suffix.length;
  if (room <= first.length) return first + suffix;
  // k labels and k - 1 dots in `room` characters, each label 1 to 63 letters.
  const count = Math.ceil((room + 1) / (LABEL_CHARS_MAX + 1));
  const letters = room - (count - 1);
  const parts: string[] = [];
  for (let i = 0; i < count; i++) {
    const size = Math.floor(letters / count) + (i < letters % count ? 1 : 0);
    parts.push(i === 0 ? (first + 'x'.repeat(size)).slice(0, size) : 'x'.repeat(size));
  }
  return parts.join('.') + suffix;
}
