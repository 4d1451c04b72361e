// Admin API schemas: the bodies of key creation and top-up.
import { type Static, Type } from '@sinclair/typebox';

const Credits = Type.Number({ minimum: 0, maximum: 9_000_000_000 });

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
