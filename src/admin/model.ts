// Admin API schemas: the bodies of key creation and top-up, and the rows of the usage and live
// request lists (the OpenAPI document shows them; the views are typed by them).
import { type Static, type TSchema, Type } from '@sinclair/typebox';
import { CREDITS_MAX, KeyViewSchema } from '../keys/model.ts';

const Credits = Type.Number({ minimum: 0, maximum: CREDITS_MAX });

export const CreateKeySchema = Type.Object(
  {
    name: Type.String({ minLength: 1, maxLength: 200 }),
    services: Type.Optional(
      Type.Array(Type.Union([Type.Literal('chat'), Type.Literal('decision')]), {
        minItems: 1,
        maxItems: 2,
      }),
    ),
    credits: Type.Optional(Credits),
    token_wallet: Type.Optional(Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER })),
    daily_decision_budget: Type.Optional(Type.Union([Type.Null(), Credits])),
    rate_limit_rpm: Type.Optional(
      Type.Union([Type.Null(), Type.Integer({ minimum: 1, maximum: 10_000_000 })]),
    ),
    key: Type.Optional(Type.String({ minLength: 1, maxLength: 256 })),
  },
  { additionalProperties: false },
);

export const CreditKeySchema = Type.Object(
  {
    credits: Type.Optional(Credits),
    tokens: Type.Optional(Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER })),
  },
  { additionalProperties: false },
);

export type CreateKeyBody = Static<typeof CreateKeySchema>;
export type CreditKeyBody = Static<typeof CreditKeySchema>;

const Count = Type.Integer({ minimum: 0 });

/** A row of GET /admin/v1/usage (CONTRACT §6); the dimensions not grouped by are left out. */
export const UsageRowSchema = Type.Object({
  day: Type.Optional(Type.String({ description: 'UTC day, YYYY-MM-DD' })),
  key_id: Type.Optional(Type.String()),
  model: Type.Optional(Type.String()),
  requests: Count,
  completed: Count,
  cancelled: Count,
  errors: Count,
  prompt_tokens: Count,
  completion_tokens: Count,
  charged_credits: Type.Number({ minimum: 0, description: 'exact µcr sum, in credits' }),
});
export type UsageRowView = Static<typeof UsageRowSchema>;

/** An item of GET /admin/v1/requests?state=in_progress (CONTRACT §6). */
export const LiveRequestSchema = Type.Object({
  id: Type.String(),
  key_id: Type.String(),
  service: Type.Union([Type.Literal('chat'), Type.Literal('decision')]),
  model: Type.String(),
  stream: Type.Boolean(),
  created: Type.Integer({ description: 'Unix seconds' }),
  age_ms: Count,
  held_credits: Type.Number({ minimum: 0 }),
  attempt: Type.Integer({
    minimum: 0,
    description: 'the attempt in flight: 1 the first deployment tried, 0 before any call',
  }),
});
export type LiveRequest = Static<typeof LiveRequestSchema>;

/** The list envelope of both. */
export const listOf = <T extends TSchema>(item: T) =>
  Type.Object({ object: Type.Literal('list'), data: Type.Array(item) });

/** POST /admin/v1/keys 201: the key, and its secret, shown this once. */
export const CreatedKeySchema = Type.Composite([
  KeyViewSchema,
  Type.Object({ key: Type.String({ description: 'the secret: tg-…, or the one imported' }) }),
]);
