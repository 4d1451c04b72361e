// The key as the admin API shows it (CONTRACT §6): TypeBox, the one source of its type
// (`keyView`, store.ts) and of its schema in the OpenAPI document. Never the secret or its hash.
import { type Static, Type } from '@sinclair/typebox';
import { ServiceSchema } from '../state/events.ts';

/** Credits as JSON numbers: µcr / 1e6 (CONTRACT §3). */
const Credits = Type.Number({ minimum: 0 });

/**
 * The most credits a key may be given in all, and in one request: below 2^33 credits a double is
 * finer than 1 µcr, so µcr / 1e6 shows every amount exactly; past it 9e9 + 0.000001 read
 * 9000000000.000002.
 */
export const CREDITS_MAX = 2 ** 33 - 1;
export const CREDITS_ADDED_MICRO_MAX = 2 ** 33 * 1_000_000 - 1;

export const KeyViewSchema = Type.Object({
  id: Type.String({ description: 'key_…' }),
  name: Type.String(),
  services: Type.Array(ServiceSchema, { minItems: 1, maxItems: 2 }),
  revoked: Type.Boolean(),
  created: Type.Integer({ minimum: 0, description: 'Unix seconds' }),
  limits: Type.Object({
    rate_limit_rpm: Type.Union([Type.Integer({ minimum: 1 }), Type.Null()], {
      description: "the key's own; null: the configured default (CONTRACT §3)",
    }),
    rate_limit_rpm_in_force: Type.Integer({
      minimum: 1,
      description: "what applies: the key's own, else the configured default",
    }),
    daily_decision_budget: Type.Union([Credits, Type.Null()]),
  }),
  balances: Type.Object({
    credits: Credits,
    held: Credits,
    charged: Credits,
    credits_added: Credits,
    token_wallet: Type.Integer({ minimum: 0 }),
  }),
});
export type KeyView = Static<typeof KeyViewSchema>;
