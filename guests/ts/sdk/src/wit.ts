/**
 * The WIT version every module of the SDK imports; one place to change when the contract
 * moves. The `wasmctrl:controller/*@0.2.1` modules themselves are provided by the component
 * at run time (componentize-js links them to the host's imports); their types are generated
 * from `wit/` by `jco guest-types` into `guests/ts/generated/` at build time.
 */
export const WIT_VERSION = "0.2.1";
