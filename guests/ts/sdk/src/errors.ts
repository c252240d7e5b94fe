/**
 * Errors, as JavaScript exceptions.
 *
 * - {@link HostError}: a host call (cache, client, events) failed. `kind` is the WIT
 *   `error` case; `retryable` is false only for `invalid` (the same input will fail again).
 * - {@link RetryableError} / {@link TerminalError}: thrown by a plugin's `reconcile` to end
 *   it with the WIT `reconcile-error` case of the same name. A {@link HostError} escaping
 *   `reconcile` becomes retryable or terminal by its `retryable` flag; any other exception
 *   becomes retryable with its message (the object is retried with backoff).
 */
import type { Error as WitError } from "wasmctrl:controller/types@0.2.1";

/** The cases of the WIT `error` variant. */
export type HostErrorKind =
  | "not-found"
  | "already-exists"
  | "conflict"
  | "forbidden"
  | "invalid"
  | "unavailable"
  | "other";

const CASE_TEXT: Record<HostErrorKind, string> = {
  "not-found": "not found",
  "already-exists": "already exists",
  conflict: "conflict",
  forbidden: "forbidden",
  invalid: "invalid",
  unavailable: "unavailable",
  other: "error",
};

/** A failed host call. */
export class HostError extends Error {
  /** The WIT error case. */
  readonly kind: HostErrorKind;
  /** The HTTP status for `other` (0 when there was none). */
  readonly status: number;
  /** The host's message without the case prefix. */
  readonly detail: string;

  constructor(kind: HostErrorKind, detail: string, status = 0) {
    const text = kind === "other" && status !== 0 ? `HTTP ${status}: ${detail}` : `${CASE_TEXT[kind]}: ${detail}`;
    super(text);
    this.name = "HostError";
    this.kind = kind;
    this.status = status;
    this.detail = detail;
  }

  /** Whether retrying later may succeed (everything but `invalid`). */
  get retryable(): boolean {
    return this.kind !== "invalid";
  }
  isNotFound(): boolean {
    return this.kind === "not-found";
  }
  isAlreadyExists(): boolean {
    return this.kind === "already-exists";
  }
  isConflict(): boolean {
    return this.kind === "conflict";
  }
  isForbidden(): boolean {
    return this.kind === "forbidden";
  }

  /** Converts what a WIT import threw (jco throws `{ payload }` or the variant itself). */
  static from(thrown: unknown): unknown {
    const payload = (thrown as { payload?: unknown } | null)?.payload ?? thrown;
    const v = payload as WitError | null;
    if (v === null || typeof v !== "object" || typeof (v as { tag?: unknown }).tag !== "string") {
      return thrown;
    }
    if (v.tag === "other") {
      return new HostError("other", v.val[1], v.val[0]);
    }
    return new HostError(v.tag, v.val);
  }
}

/** Ends a reconcile with `retryable(message)`: retried with per-key exponential backoff. */
export class RetryableError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "RetryableError";
  }
}

/** Ends a reconcile with `terminal(message)`: not retried until the object changes. */
export class TerminalError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "TerminalError";
  }
}

/** Runs `f`, turning what a WIT import throws into a {@link HostError}. */
export function hostCall<T>(f: () => T): T {
  try {
    return f();
  } catch (e) {
    throw HostError.from(e);
  }
}

/**
 * Adds `what` in front of a failure's message, keeping its class (e.g.
 * `withContext("creating copy team-a/x", () => client.create(copy))`).
 */
export function withContext<T>(what: string, f: () => T): T {
  try {
    return f();
  } catch (e) {
    if (e instanceof HostError) {
      throw e.retryable
        ? new RetryableError(`${what}: ${e.message}`, { cause: e })
        : new TerminalError(`${what}: ${e.message}`, { cause: e });
    }
    if (e instanceof TerminalError) {
      throw new TerminalError(`${what}: ${e.message}`, { cause: e });
    }
    if (e instanceof Error) {
      throw new RetryableError(`${what}: ${e.message}`, { cause: e });
    }
    throw e;
  }
}

/** Returns `undefined` instead of throwing when `f` fails with not-found. */
export function ignoreNotFound<T>(f: () => T): T | undefined {
  try {
    return f();
  } catch (e) {
    if (e instanceof HostError && e.isNotFound()) {
      return undefined;
    }
    throw e;
  }
}
