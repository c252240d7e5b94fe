/** The fake `wasmctrl:controller/config` import: the installed host's name and settings. */
import { installedHost } from "../index.js";
import { encodeJson } from "./json.js";

export function pluginName(): string {
  return installedHost().pluginName;
}

export function settings(): Uint8Array {
  return encodeJson(installedHost().settings);
}
