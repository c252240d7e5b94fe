/**
 * The web globals StarlingMonkey (the JavaScript engine componentize-js embeds) provides
 * and the SDK uses. Declared here rather than with the DOM lib, which would also claim
 * `fetch`, timers and the rest that a plugin cannot use.
 */
declare class TextEncoder {
  encode(input?: string): Uint8Array;
}
declare class TextDecoder {
  constructor(label?: string);
  decode(input?: Uint8Array): string;
}
declare const console: {
  log(...data: unknown[]): void;
  error(...data: unknown[]): void;
};
