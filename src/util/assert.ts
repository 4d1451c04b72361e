// Programmer errors: a broken invariant throws and must never be served as a normal answer.
export class AssertionError extends Error {
  override name = 'AssertionError';
}

export function assert(condition: unknown, message = 'assertion failed'): asserts condition {
  if (!condition) throw new AssertionError(message);
}
