// The log's two failures: a log on disk that cannot be trusted, and a log that cannot be written.

/**
 * The log on disk is damaged in a way a crash cannot explain; starting would lose acknowledged
 * facts.
 */
export class WalCorruptionError extends Error {
  override name = 'WalCorruptionError';
}

/** The log cannot be written (a failed write or fsync); nothing may be acknowledged after it. */
export class WalUnavailableError extends Error {
  override name = 'WalUnavailableError';
}
