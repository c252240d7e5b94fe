/**
 * The plugin's own configuration: its name and its `[settings]` table (the same JSON
 * `init` receives).
 */
import * as wit from "wasmctrl:controller/config@0.2.1";
import { decode } from "./objects.js";

/** The plugin's name (its TOML's `name`). */
export function pluginName(): string {
  return wit.pluginName();
}

/** The `[settings]` table as a plain object. */
export function settings<T = Record<string, unknown>>(): T {
  return decode<T>(wit.settings());
}
