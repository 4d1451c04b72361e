// Builds one provider instance per configured provider name; models refer to them by that name.
import { countTextTokensYielding } from '../billing/tokens.ts';
import type { Config } from '../config/model.ts';
import type { Logger } from '../util/log.ts';
import { anthropicDialect } from './anthropic/index.ts';
import { GEMINI_DIALECT } from './gemini/index.ts';
import { HttpProvider, type HttpProviderOptions } from './http/http-provider.ts';
import { OPENAI_DIALECT } from './openai/index.ts';
import type { Provider } from './provider.ts';
import { SimulatorProvider } from './simulator/index.ts';

export function createProviders(config: Config, logger: Logger): Map<string, Provider> {
  const providers = new Map<string, Provider>();
  for (const [name, providerConfig] of Object.entries(config.providers)) {
    switch (providerConfig.type) {
      case 'simulator':
        providers.set(
          name,
          new SimulatorProvider(
            name,
            providerConfig,
            countTextTokensYielding,
            config.limits.simulator_tool_arguments_bytes,
          ),
        );
        break;
      case 'openai':
      case 'anthropic':
      case 'gemini': {
        const options: HttpProviderOptions = {
          defaultTimeoutMs: config.limits.upstream_timeout_ms,
          bodyBytesMax: config.limits.max_upstream_body_bytes,
          eventBytesMax: config.limits.max_upstream_event_bytes,
          logger: logger.child({ provider: name }),
        };
        const dialect =
          providerConfig.type === 'openai'
            ? OPENAI_DIALECT
            : providerConfig.type === 'anthropic'
              ? anthropicDialect(providerConfig)
              : GEMINI_DIALECT;
        providers.set(name, new HttpProvider(name, providerConfig, dialect, options));
        break;
      }
    }
  }
  return providers;
}
