// Rates to micro-credits: a rate of R credits per 1M tokens costs exactly R µcr per token.
import type { ModelConfig, Rates } from '../config/model.ts';
import { assert } from '../util/assert.ts';

/**
 * The rates a request pays: model_01-style long-context rates from the threshold on, for the whole
 * request.
 */
export function ratesFor(model: ModelConfig, promptTokens: number): Rates {
  const long = model.long_context;
  return long && promptTokens >= long.threshold_tokens ? long.rates : model.rates;
}

export function costMicro(rates: Rates, promptTokens: number, completionTokens: number): number {
  const micro = promptTokens * rates.input + completionTokens * rates.output;
  assert(Number.isSafeInteger(micro), 'cost overflows a safe integer');
  return micro;
}

/** The hold placed before the provider is called: the input estimate plus the whole output cap. */
export function reservationMicro(
  model: ModelConfig,
  promptTokensEstimate: number,
  outputCapTokens: number,
): number {
  return costMicro(ratesFor(model, promptTokensEstimate), promptTokensEstimate, outputCapTokens);
}

/**
 * What a completed request is charged: actual usage at the model's rates, never more than its hold.
 */
export function chargeMicro(
  model: ModelConfig,
  promptTokens: number,
  completionTokens: number,
  holdMicro: number,
): number {
  return Math.min(
    holdMicro,
    costMicro(ratesFor(model, promptTokens), promptTokens, completionTokens),
  );
}
