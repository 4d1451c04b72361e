// Deployments and failover (CONTRACT §7): each call tries one deployment of its model (a weighted
// pick among the healthy ones) and, on a failure another deployment may not share, the next, until
// something reached the client or `routing.max_attempts` were made. Every attempt is listed for the
// request's status record; a deployment that keeps failing is skipped for a cooldown.
import type { Config } from '../config/model.ts';
import { type AbortKind, AbortReason, statusForAbort } from '../requests/actor.ts';
import type { Attempt, AttemptView } from '../state/events.ts';
import type { RunSignal } from '../util/abort.ts';
import { AssertionError, assert } from '../util/assert.ts';
import { GatewayError } from '../util/errors.ts';
import { collectAnswer, type Delta, type Provider, type ProviderRequest } from './provider.ts';

export type { Attempt };

export type AttemptOutcome = Attempt['outcome'];

export type DeploymentHealth = 'healthy' | 'ejected' | 'probing';

/** A deployment and its health; one per (model, deployment), shared by every call of the model. */
export class DeploymentState {
  /** Failures in a row (a success resets it). */
  failures = 0;
  /** While ejected: when the next call may probe it. */
  ejectedUntilMs = 0;
  /** One call is probing it after its cooldown; nobody else picks it meanwhile. */
  probing = false;
  readonly attemptsByOutcome: Record<AttemptOutcome, number> = { ok: 0, error: 0, cancelled: 0 };

  constructor(
    readonly model: string,
    readonly providerName: string,
    readonly provider: Provider,
    readonly upstreamModel: string,
    readonly weight: number,
  ) {}

  /**
   * Ejected until a probe answers: past its cooldown it is pickable (the next pick probes it) but
   * not yet shown healthy, which only an answer proves.
   */
  health(): DeploymentHealth {
    if (this.probing) return 'probing';
    return this.ejectedUntilMs !== 0 ? 'ejected' : 'healthy';
  }

  /** Whether a call may pick it now; an ejected one whose cooldown ended becomes the probe. */
  available(nowMs: number): boolean {
    return !this.probing && this.ejectedUntilMs <= nowMs;
  }
}

interface Route {
  deployments: DeploymentState[];
}

export class Router {
  private readonly routes = new Map<string, Route>();
  private readonly maxAttempts: number;
  private readonly failuresToEject: number;
  private readonly cooldownMs: number;

  constructor(
    config: Config,
    providers: ReadonlyMap<string, Provider>,
    /** Chooses among weights; a test may make it deterministic. */
    private readonly random: () => number = Math.random,
  ) {
    this.maxAttempts = config.routing.max_attempts;
    this.failuresToEject = config.routing.failures_to_eject;
    this.cooldownMs = config.routing.cooldown_ms;
    for (const [id, model] of Object.entries(config.models)) {
      const deployments = model.deployments.map((deployment) => {
        const provider = providers.get(deployment.provider);
        assert(provider !== undefined, `no provider ${deployment.provider}`);
        return new DeploymentState(
          id,
          deployment.provider,
          provider,
          deployment.upstream_model ?? id,
          deployment.weight ?? 1,
        );
      });
      this.routes.set(id, { deployments });
    }
  }

  /** Every deployment's state, for /metrics. */
  *deployments(): Iterable<DeploymentState> {
    for (const route of this.routes.values()) yield* route.deployments;
  }

  /**
   * The model's answer as a stream of deltas, from the first deployment that gives one. Failover
   * happens only before the first delta is handed on (after it, the client has bytes).
   */
  async *stream(
    modelId: string,
    request: ProviderRequest,
    signal: RunSignal,
    attempts: Attempt[],
  ): AsyncGenerator<Delta> {
    const route = this.route(modelId);
    const tried = triedList(route);
    let attemptsMade = 0;
    let failure: unknown = null;
    while (attemptsMade < this.maxAttempts) {
      signal.throwIfAborted();
      const deployment = this.pick(route, tried, attemptsMade);
      if (deployment === null) break;
      tried?.push(deployment);
      attemptsMade++;
      const attempt = this.begin(deployment, attempts);
      const startedMs = performance.now();
      let handedOn = false;
      let settled = false;
      try {
        for await (const delta of deployment.provider.stream(
          forDeployment(request, deployment),
          signal,
        )) {
          handedOn = true;
          yield delta;
        }
        settled = true;
        this.settle(deployment, attempt, startedMs, null, signal);
        return;
      } catch (error) {
        settled = true;
        this.settle(deployment, attempt, startedMs, error, signal);
        if (handedOn || signal.aborted || !failsOver(error)) throw error;
        failure = error;
      } finally {
        // The consumer stopped early (an abort, or it had all it wanted): not the deployment's
        // fault.
        if (!settled) this.settle(deployment, attempt, startedMs, null, signal);
      }
    }
    throw failure ?? noDeployment(modelId);
  }

  /** The model's whole answer, from the first deployment that gives one. */
  async complete(
    modelId: string,
    request: ProviderRequest,
    signal: RunSignal,
    attempts: Attempt[],
  ): Promise<Delta[]> {
    const route = this.route(modelId);
    const tried = triedList(route);
    let attemptsMade = 0;
    let failure: unknown = null;
    while (attemptsMade < this.maxAttempts) {
      signal.throwIfAborted();
      const deployment = this.pick(route, tried, attemptsMade);
      if (deployment === null) break;
      tried?.push(deployment);
      attemptsMade++;
      const attempt = this.begin(deployment, attempts);
      const startedMs = performance.now();
      const call = forDeployment(request, deployment);
      try {
        const deltas = await collectAnswer(deployment.provider, call, signal);
        this.settle(deployment, attempt, startedMs, null, signal);
        return deltas;
      } catch (error) {
        this.settle(deployment, attempt, startedMs, error, signal);
        if (signal.aborted || !failsOver(error)) throw error;
        failure = error;
      }
    }
    throw failure ?? noDeployment(modelId);
  }

  private route(modelId: string): Route {
    const route = this.routes.get(modelId);
    if (route === undefined) throw new AssertionError(`no route for ${modelId}`);
    return route;
  }

  /**
   * A weighted pick among the deployments not yet tried that are available. When none is and this
   * is the call's first attempt, the one whose cooldown ends first: a call is never refused without
   * trying (a model with one deployment keeps answering while it recovers).
   */
  private pick(
    route: Route,
    tried: readonly DeploymentState[] | null,
    attemptsMade: number,
  ): DeploymentState | null {
    const nowMs = Date.now();
    const { deployments } = route;
    if (tried === null) {
      const only = deployments[0]!;
      return attemptsMade === 0 ? this.claim(only, nowMs) : null;
    }
    let total = 0;
    for (const deployment of deployments) {
      if (!tried.includes(deployment) && deployment.available(nowMs)) total += deployment.weight;
    }
    if (total === 0) {
      if (attemptsMade > 0) return null;
      let soonest = deployments[0]!;
      for (const deployment of deployments) {
        if (deployment.ejectedUntilMs < soonest.ejectedUntilMs) soonest = deployment;
      }
      return soonest;
    }
    let point = this.random() * total;
    for (const deployment of deployments) {
      if (tried.includes(deployment) || !deployment.available(nowMs)) continue;
      point -= deployment.weight;
      if (point < 0) return this.claim(deployment, nowMs);
    }
    // Rounding left the point at the very end: the last available one.
    for (let i = deployments.length - 1; i >= 0; i--) {
      const deployment = deployments[i]!;
      if (!tried.includes(deployment) && deployment.available(nowMs))
        return this.claim(deployment, nowMs);
    }
    return null;
  }

  /** Taking an ejected deployment after its cooldown makes this call its one probe. */
  private claim(deployment: DeploymentState, nowMs: number): DeploymentState {
    if (deployment.ejectedUntilMs !== 0 && deployment.ejectedUntilMs <= nowMs) {
      deployment.probing = true;
    }
    return deployment;
  }

  private begin(deployment: DeploymentState, attempts: Attempt[]): Attempt {
    const attempt: Attempt = {
      provider: deployment.providerName,
      upstream_model: deployment.upstreamModel,
      outcome: 'ok',
      error_code: null,
      latency_ms: 0,
    };
    attempts.push(attempt);
    runningSince.set(attempt, performance.now());
    return attempt;
  }

  /** Ends an attempt: its outcome, and what it says of the deployment's health. */
  private settle(
    deployment: DeploymentState,
    attempt: Attempt,
    startedMs: number,
    error: unknown,
    signal: RunSignal,
  ): void {
    attempt.latency_ms = Math.round(performance.now() - startedMs);
    runningSince.delete(attempt);
    const wasProbe = deployment.probing;
    deployment.probing = false;
    const stoppedBy = signal.aborted ? failedByAbort(signal.reason) : null;
    if (stoppedBy !== null) {
      // The request's own time ran out (or the gateway stopped) during this attempt: it failed with
      // the request's code, not as a cancel. The deployment's health is not judged on it: the
      // deadline is the request's, whatever part of it earlier attempts took.
      attempt.outcome = 'error';
      attempt.error_code = stoppedBy;
    } else if (error === null || signal.aborted) {
      attempt.outcome = error === null && !signal.aborted ? 'ok' : 'cancelled';
      if (attempt.outcome === 'ok') {
        deployment.failures = 0;
        deployment.ejectedUntilMs = 0;
      }
    } else {
      attempt.outcome = 'error';
      attempt.error_code = error instanceof GatewayError ? error.code : 'internal_error';
      // Only what another deployment might not share counts against this one (a 400 is the
      // request's fault, not the deployment's).
      if (failsOver(error)) {
        deployment.failures++;
        if (wasProbe || deployment.failures >= this.failuresToEject) {
          deployment.ejectedUntilMs = Date.now() + this.cooldownMs;
        }
      }
    }
    deployment.attemptsByOutcome[attempt.outcome]++;
  }
}

/** When each attempt still running began (performance.now()); settled ones are not in it. */
const runningSince = new WeakMap<Attempt, number>();

/**
 * An attempt as a lookup shows it: one still running is `in_progress`, with its latency so far
 * (its own fields say `ok` and 0 until it settles).
 */
export function attemptView(attempt: Attempt): AttemptView {
  const since = runningSince.get(attempt);
  if (since === undefined) return attempt;
  return {
    ...attempt,
    outcome: 'in_progress',
    latency_ms: Math.round(performance.now() - since),
  };
}

/**
 * The deployments a call has tried, for a route with a choice; null for a route of one (most), for
 * which the count of attempts made says all: no list per call.
 */
function triedList(route: Route): DeploymentState[] | null {
  return route.deployments.length === 1 ? null : [];
}

/**
 * The request with the deployment's own model id; the service's request as it is when that is its
 * model already (one deployment, the common case: no copy per call).
 */
function forDeployment(request: ProviderRequest, deployment: DeploymentState): ProviderRequest {
  return request.model === deployment.upstreamModel
    ? request
    : { ...request, model: deployment.upstreamModel };
}

/**
 * The error code of an abort that fails the request (its deadline, the stream's, a shutdown), or
 * null for one that cancels it (the client's cancel or disconnect).
 */
function failedByAbort(reason: unknown): AbortKind | null {
  return reason instanceof AbortReason && statusForAbort(reason.kind) === 'error'
    ? reason.kind
    : null;
}

function failsOver(error: unknown): boolean {
  return error instanceof GatewayError && error.failover;
}

function noDeployment(modelId: string): GatewayError {
  return new GatewayError(
    'upstream_unreachable',
    `No deployment of ${modelId} could be tried; retry shortly.`,
  );
}
