// The event union: every durable fact of the gateway, as appended to the log and replayed on start.
import { type Static, Type } from '@sinclair/typebox';
import { TypeCompiler } from '@sinclair/typebox/compiler';

const Id = Type.String({ minLength: 1, maxLength: 128 });
const Micro = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
const Count = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
const TimeMs = Type.Integer({ minimum: 0 });
export const ServiceSchema = Type.Union([Type.Literal('chat'), Type.Literal('decision')]);
export const RequestStatusSchema = Type.Union([
  Type.Literal('in_progress'),
  Type.Literal('completed'),
  Type.Literal('cancelled'),
  Type.Literal('error'),
]);
export const UsageSchema = Type.Object({
  prompt_tokens: Count,
  completion_tokens: Count,
  total_tokens: Count,
});
/**
 * What a hold or a charge takes: credits in µcr, and (decision only) tokens from the token wallet.
 */
export const AmountSchema = Type.Object({ credits_micro: Micro, tokens: Count });

export const KeyCreatedSchema = Type.Object({
  type: Type.Literal('key.created'),
  key_id: Id,
  name: Type.String({ maxLength: 200 }),
  secret_sha256: Type.String({ pattern: '^[0-9a-f]{64}$' }),
  services: Type.Array(ServiceSchema, { minItems: 1, maxItems: 2 }),
  credits_micro: Micro,
  token_wallet: Count,
  daily_decision_budget_micro: Type.Union([Type.Null(), Micro]),
  rate_limit_rpm: Type.Union([Type.Null(), Type.Integer({ minimum: 1 })]),
  at_ms: TimeMs,
});

export const KeyRevokedSchema = Type.Object({
  type: Type.Literal('key.revoked'),
  key_id: Id,
  at_ms: TimeMs,
});

export const KeyCreditedSchema = Type.Object({
  type: Type.Literal('key.credited'),
  key_id: Id,
  credits_micro: Micro,
  tokens: Count,
  at_ms: TimeMs,
});

export const RequestStartedSchema = Type.Object({
  type: Type.Literal('request.started'),
  request_id: Id,
  key_id: Id,
  service: ServiceSchema,
  model: Type.String({ maxLength: 128 }),
  stream: Type.Boolean(),
  hold: AmountSchema,
  idempotency: Type.Union([
    Type.Null(),
    Type.Object({
      key: Type.String({ maxLength: 255 }),
      fingerprint: Type.String({ maxLength: 64 }),
      expires_at_ms: TimeMs,
    }),
  ]),
  /** Decision only: credits-equivalent of the hold, reserved against the key's daily budget. */
  budget_hold_micro: Micro,
  at_ms: TimeMs,
});

/** Attempts one request may list (routing.max_attempts is at most this). */
export const ATTEMPTS_MAX = 16;

/** One try of one deployment (CONTRACT §7), as the status record lists it. */
export const AttemptSchema = Type.Object({
  provider: Type.String({ maxLength: 128 }),
  upstream_model: Type.String({ maxLength: 256 }),
  outcome: Type.Union([Type.Literal('ok'), Type.Literal('error'), Type.Literal('cancelled')]),
  error_code: Type.Union([Type.Null(), Type.String({ maxLength: 64 })]),
  latency_ms: Count,
});

/**
 * An attempt as a lookup shows it: one still running is `in_progress`, its latency so far. Never
 * logged (the log's attempts are all settled: AttemptSchema).
 */
export const AttemptViewSchema = Type.Object({
  provider: AttemptSchema.properties.provider,
  upstream_model: AttemptSchema.properties.upstream_model,
  outcome: Type.Union([
    Type.Literal('ok'),
    Type.Literal('error'),
    Type.Literal('cancelled'),
    Type.Literal('in_progress'),
  ]),
  error_code: AttemptSchema.properties.error_code,
  latency_ms: Count,
});
export type AttemptView = Static<typeof AttemptViewSchema>;

export const RequestFinishedSchema = Type.Object({
  type: Type.Literal('request.finished'),
  request_id: Id,
  status: Type.Union([Type.Literal('completed'), Type.Literal('cancelled'), Type.Literal('error')]),
  error_code: Type.Union([Type.Null(), Type.String({ maxLength: 64 })]),
  http_status: Type.Union([Type.Null(), Type.Integer({ minimum: 100, maximum: 599 })]),
  usage: Type.Union([Type.Null(), UsageSchema]),
  charge: AmountSchema,
  /**
   * Decision only: credits-equivalent spend counted against the daily budget of the UTC day `day`.
   */
  budget_spend_micro: Micro,
  /** Decision only: the answers of a completed decision, for the lookup endpoint. */
  answers: Type.Union([Type.Null(), Type.Record(Type.String(), Type.Unknown())]),
  /** The deployments tried, in order (absent in logs written before failover existed). */
  attempts: Type.Optional(Type.Array(AttemptSchema, { maxItems: ATTEMPTS_MAX })),
  at_ms: TimeMs,
});

/**
 * A refused decision request, recorded by releases before CONTRACT §8 (refusals now write nothing);
 * still replayed from their logs.
 */
export const RequestRecordedSchema = Type.Object({
  type: Type.Literal('request.recorded'),
  request_id: Id,
  key_id: Id,
  service: ServiceSchema,
  model: Type.String({ maxLength: 128 }),
  status: Type.Union([Type.Literal('cancelled'), Type.Literal('error')]),
  error_code: Type.String({ maxLength: 64 }),
  http_status: Type.Integer({ minimum: 100, maximum: 599 }),
  at_ms: TimeMs,
});

export const EventSchema = Type.Union([
  KeyCreatedSchema,
  KeyRevokedSchema,
  KeyCreditedSchema,
  RequestStartedSchema,
  RequestFinishedSchema,
  RequestRecordedSchema,
]);

export type Event = Static<typeof EventSchema>;
export type KeyCreated = Static<typeof KeyCreatedSchema>;
export type RequestStarted = Static<typeof RequestStartedSchema>;
export type RequestFinished = Static<typeof RequestFinishedSchema>;
export type RequestRecorded = Static<typeof RequestRecordedSchema>;
export type Service = Static<typeof ServiceSchema>;
export type RequestStatus = Static<typeof RequestStatusSchema>;
export type Usage = Static<typeof UsageSchema>;
export type Amount = Static<typeof AmountSchema>;
export type Attempt = Static<typeof AttemptSchema>;

const EventCheck = TypeCompiler.Compile(EventSchema);

/** Asserts the shape of an event at both edges of durability: before append and after read-back. */
export function checkEvent(event: unknown): Event {
  if (!EventCheck.Check(event)) {
    const first = EventCheck.Errors(event).First();
    throw new Error(
      `invalid event ${(event as { type?: string })?.type ?? '?'}: ` +
        `${first?.path} ${first?.message}`,
    );
  }
  return event;
}
