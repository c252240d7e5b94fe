/**
 * The TypeScript admission test plugin and the SDK's admission exports under it, natively
 * on the SDK's fake host: a validation's answer (allowed, refused with its message and code,
 * warnings either way), a host error's refusal, a throw that traps, a mutation's JSON patch,
 * and the JSON diff (the twin of guests/python/tests/test_admission.py). Run by
 * `cargo xtask build-guests`.
 */
import assert from "node:assert/strict";
import { beforeEach, describe, test } from "node:test";
import {
  Action,
  AdmissionRequest,
  Denied,
  HostError,
  exportMutator,
  exportPlugin,
  exportValidator,
  kinds,
  type ConfigMap,
} from "@wasmctrl/guest";
import { FakeHost, admissionRequest, patchOf } from "@wasmctrl/guest/testing";
import { mutator, reconciler, validator } from "../src/index.ts";

function cm(name: string, data: Record<string, string> = {}, labels?: Record<string, string>, namespace = "default"): ConfigMap {
  return { apiVersion: "v1", kind: "ConfigMap", metadata: { name, namespace, ...(labels && { labels }) }, data };
}

let host: FakeHost;

describe("the admission test plugin", () => {
  beforeEach(() => {
    host = new FakeHost().install();
    reconciler.init(host.settingsJson({ stamp: "s1" }));
  });

  test("an ordinary ConfigMap is admitted, with the plugin's warning", () => {
    const v = validator.validate(admissionRequest("create", cm("a", { color: "blue" })));
    assert.deepEqual(v, { denial: undefined, warnings: ["validated by s1"] });
  });

  test("data.deny is refused with its value as the message (403: no code), warnings kept", () => {
    const v = validator.validate(admissionRequest("create", cm("a", { deny: "no ConfigMaps today" })));
    assert.deepEqual(v, { denial: { message: "no ConfigMaps today", code: undefined }, warnings: ["validated by s1"] });
  });

  test("data.invalid is refused as invalid (422)", () => {
    const v = validator.validate(admissionRequest("update", cm("a", { invalid: "x" }), { oldObject: cm("a") }));
    assert.deepEqual(v.denial, { message: "data.invalid is not allowed", code: 422 });
    assert.deepEqual(v.warnings, ["validated by s1"]);
  });

  test("data.unique is refused when another ConfigMap of the namespace has the value", () => {
    host.put(cm("first", { unique: "blue" }));
    host.put(cm("elsewhere", { unique: "green" }, undefined, "other"));
    const taken = validator.validate(admissionRequest("create", cm("second", { unique: "blue" })));
    assert.deepEqual(taken.denial, { message: "unique value blue is taken by default/first", code: undefined });
    // Its own value, and a value used only in another namespace, are free.
    assert.equal(validator.validate(admissionRequest("update", cm("first", { unique: "blue" }))).denial, undefined);
    assert.equal(validator.validate(admissionRequest("create", cm("second", { unique: "green" }))).denial, undefined);
  });

  test("a failed cache read refuses the request with the host's error, code 500", () => {
    host.failNext("cache.list", { tag: "unavailable", val: "cache down" });
    const v = validator.validate(admissionRequest("create", cm("a", { unique: "blue" })));
    assert.deepEqual(v, { denial: { message: "unavailable: cache down", code: 500 }, warnings: ["validated by s1"] });
  });

  test("any other exception is logged and traps (no verdict)", () => {
    assert.throws(() => validator.validate(admissionRequest("create", cm("a", { throw: "1" }))), TypeError);
    assert.ok(
      host.logs.some((l) => l.level === "error" && l.message === "validate threw" && l.fields.error === "TypeError: validate threw on purpose"),
      JSON.stringify(host.logs),
    );
  });

  test("a mutation labels stamp=<stamp>: the JSON patch of that change, with the warning", () => {
    const m = mutator.mutate(admissionRequest("create", cm("a")));
    assert.deepEqual(m.verdict, { denial: undefined, warnings: ["mutated by s1"] });
    assert.deepEqual(patchOf(m), [{ op: "add", path: "/metadata/labels", value: { stamp: "s1" } }]);

    const withLabels = mutator.mutate(admissionRequest("update", cm("a", {}, { app: "web", stamp: "old" })));
    assert.deepEqual(patchOf(withLabels), [{ op: "replace", path: "/metadata/labels/stamp", value: "s1" }]);
  });

  test("an object already stamped gets no patch; a delete is not mutated", () => {
    const same = mutator.mutate(admissionRequest("update", cm("a", {}, { stamp: "s1" })));
    assert.equal(same.patch, undefined);
    assert.deepEqual(same.verdict.warnings, ["mutated by s1"]);

    const deleted = mutator.mutate(admissionRequest("delete", undefined, { oldObject: cm("a") }));
    assert.deepEqual(deleted, { verdict: { denial: undefined, warnings: [] }, patch: undefined });
  });
});

describe("the SDK's admission exports", () => {
  class Policy {
    static forKind = kinds.ConfigMap;
    constructor(_settings: unknown) {}
    reconcile(): Action {
      return Action.done;
    }
    validate(request: AdmissionRequest<ConfigMap>): void {
      if (request.object?.data?.["host-error"] !== undefined) throw new HostError("forbidden", "not allowed to read");
    }
    mutate(request: AdmissionRequest<ConfigMap>): void {
      // Changed in place, nothing returned: the patch is still computed.
      const o = request.object!;
      if (o.data?.refuse !== undefined) throw new Denied("refused while mutating", 400);
      delete o.metadata.annotations;
      o.data = { ...o.data, "a/b~c": "2", added: "yes" };
      o.metadata.finalizers?.push("example.com/c");
    }
  }
  const validate = exportValidator(Policy);
  const mutate = exportMutator(Policy);

  beforeEach(() => {
    host = new FakeHost().install();
    exportPlugin(Policy).init(host.settingsJson({}));
  });

  test("a HostError thrown by validate is a refusal with code 500", () => {
    const v = validate.validate(admissionRequest("create", cm("a", { "host-error": "1" })));
    assert.deepEqual(v.denial, { message: "forbidden: not allowed to read", code: 500 });
  });

  test("the patch removes, escapes pointers, and replaces arrays whole", () => {
    const o = cm("a", { "a/b~c": "1" });
    o.metadata.annotations = { x: "y" };
    o.metadata.finalizers = ["example.com/a", "example.com/b"];
    const m = mutate.mutate(admissionRequest("create", o));
    assert.deepEqual(patchOf(m), [
      { op: "remove", path: "/metadata/annotations" },
      { op: "replace", path: "/metadata/finalizers", value: ["example.com/a", "example.com/b", "example.com/c"] },
      { op: "replace", path: "/data/a~1b~0c", value: "2" },
      { op: "add", path: "/data/added", value: "yes" },
    ]);
  });

  test("mutate is not called on a delete", () => {
    // Policy.mutate would throw on the missing object.
    const m = mutate.mutate(admissionRequest("delete", undefined, { oldObject: cm("a") }));
    assert.deepEqual(m, { verdict: { denial: undefined, warnings: [] }, patch: undefined });
  });

  test("a refusal while mutating carries its code and no patch", () => {
    const m = mutate.mutate(admissionRequest("create", cm("a", { refuse: "1" })));
    assert.deepEqual(m, { verdict: { denial: { message: "refused while mutating", code: 400 }, warnings: [] }, patch: undefined });
  });
});
