/**
 * Structured logs into the host's tracing, tagged with the plugin's name and the request
 * being reconciled: `log.info("mirrored default/x", { created: "team-a" })`. Field values
 * that are not strings are written as JSON.
 */
import * as wit from "wasmctrl:controller/log@0.2.1";

export type Level = "trace" | "debug" | "info" | "warn" | "error";

/** Key/value fields of a log line. */
export type Fields = Record<string, unknown>;

/** Whether a line at `level` would be recorded (skip building costly messages). */
export function enabled(level: Level): boolean {
  return wit.enabled(level);
}

/** Logs `message` at `level` with `fields`. */
export function log(level: Level, message: string, fields: Fields = {}): void {
  const pairs: Array<[string, string]> = Object.entries(fields).map(([k, v]) => [k, fieldText(v)]);
  wit.log(level, message, pairs);
}

export function trace(message: string, fields?: Fields): void {
  log("trace", message, fields);
}
export function debug(message: string, fields?: Fields): void {
  log("debug", message, fields);
}
export function info(message: string, fields?: Fields): void {
  log("info", message, fields);
}
export function warn(message: string, fields?: Fields): void {
  log("warn", message, fields);
}
export function error(message: string, fields?: Fields): void {
  log("error", message, fields);
}

function fieldText(v: unknown): string {
  if (typeof v === "string") {
    return v;
  }
  if (v instanceof Error) {
    return v.message;
  }
  if (Array.isArray(v) && v.every((x) => typeof x === "string")) {
    return v.join(",");
  }
  return JSON.stringify(v) ?? String(v);
}
