/**
 * The TypeScript configmap-mirror and the SDK under it, natively on the SDK's fake host:
 * the examples/EXPECTED.md rows that do not need a real API server (the twin of
 * guests/python/tests/test_mirror.py). Run by `cargo xtask build-guests`.
 */
import assert from "node:assert/strict";
import { beforeEach, describe, test } from "node:test";
import {
  HostError,
  client,
  exportPlugin,
  ignoreNotFound,
  kinds,
  type ConfigMap,
  type KubeObject,
  type PluginClass,
  type Target,
} from "@wasmctrl/guest";
import { FakeHost } from "@wasmctrl/guest/testing";
import { FINALIZER, MANAGED_BY, MANAGED_BY_LABEL, SOURCE_ANNOTATION, reconciler } from "../src/index.ts";

const CM = kinds.ConfigMap;

function source(data: Record<string, string> = { color: "blue" }, labels: Record<string, string> = { mirror: "true" }): ConfigMap {
  return { apiVersion: "v1", kind: "ConfigMap", metadata: { name: "app-config", namespace: "default", labels }, data };
}

function namespace(name: string): KubeObject {
  return { apiVersion: "v1", kind: "Namespace", metadata: { name } };
}

let host: FakeHost;

function reconcile(ns = "default", name = "app-config") {
  return reconciler.reconcile({ namespace: ns, name });
}

describe("configmap-mirror", () => {
  beforeEach(() => {
    host = new FakeHost({
      indexes: { "by-source": (o) => [o.metadata.annotations?.[SOURCE_ANNOTATION]].filter((v) => v !== undefined) },
    }).install();
    for (const ns of ["default", "team-a", "team-b"]) host.put(namespace(ns));
    const info = reconciler.init(host.settingsJson({ namespaces: ["team-a", "team-b"] }));
    assert.deepEqual(info.hooks, { onAdd: false, onUpdate: false, onDelete: false, map: true, filter: false });
    assert.deepEqual(info.forKind, { apiVersion: "v1", kind: "ConfigMap" });
  });

  test("copies a source, with the finalizer and an Event", () => {
    host.put(source());
    assert.deepEqual(reconcile(), { tag: "done" });
    assert.ok(host.get(CM, "default", "app-config")?.metadata.finalizers?.includes(FINALIZER));
    for (const ns of ["team-a", "team-b"]) {
      const copy = host.get(CM, ns, "app-config");
      assert.deepEqual(copy?.data, { color: "blue" });
      assert.deepEqual(copy?.metadata.labels, { [MANAGED_BY_LABEL]: MANAGED_BY });
      assert.deepEqual(copy?.metadata.annotations, { [SOURCE_ANNOTATION]: "default/app-config" });
      assert.equal(copy?.metadata.ownerReferences, undefined);
    }
    assert.equal(host.events.length, 1);
    const [event] = host.events;
    assert.deepEqual([event.reason, event.action, event.type], ["Mirrored", "Sync", "normal"]);
    assert.match(event.note, /^copies created in \[team-a, team-b\]/);
    assert.ok(host.logs.some((l) => l.message === "mirrored default/app-config"), JSON.stringify(host.logs));
  });

  test("a steady state writes nothing", () => {
    host.put(source());
    reconcile();
    host.writes.length = 0;
    host.events.length = 0;
    reconcile();
    assert.deepEqual(host.writes, []);
    assert.deepEqual(host.events, []);
  });

  test("a removed key and an edited copy are put back", () => {
    host.put(source({ a: "1", b: "2" }));
    reconcile();
    const src = host.get(CM, "default", "app-config")!;
    host.put({ ...src, data: { a: "1" } });
    const copy = host.get(CM, "team-a", "app-config")!;
    host.put({ ...copy, data: { a: "edited" } });
    reconcile();
    for (const ns of ["team-a", "team-b"]) assert.deepEqual(host.get(CM, ns, "app-config")?.data, { a: "1" });
  });

  test("an unlabelled source loses its copies and the finalizer", () => {
    host.put(source());
    reconcile();
    const src = host.get(CM, "default", "app-config")!;
    host.put({ ...src, metadata: { ...src.metadata, labels: {} } });
    reconcile();
    assert.equal(host.get(CM, "team-a", "app-config"), undefined);
    assert.equal(host.get(CM, "team-b", "app-config"), undefined);
    assert.ok(!(host.get(CM, "default", "app-config")?.metadata.finalizers ?? []).includes(FINALIZER));
  });

  test("a deleted source is cleaned up, then goes", () => {
    host.put(source());
    reconcile();
    client.delete(CM, "default", "app-config"); // marked: the finalizer holds it
    assert.ok(host.get(CM, "default", "app-config")?.metadata.deletionTimestamp);
    reconcile();
    assert.equal(host.get(CM, "default", "app-config"), undefined);
    assert.equal(host.get(CM, "team-a", "app-config"), undefined);
    assert.ok(host.events.some((e) => e.reason === "CopiesDeleted"));
  });

  test("a foreign ConfigMap is left alone, with a Warning", () => {
    host.put({ apiVersion: "v1", kind: "ConfigMap", metadata: { name: "app-config", namespace: "team-b" }, data: { mine: "1" } });
    host.put(source());
    reconcile();
    assert.deepEqual(host.get(CM, "team-b", "app-config")?.data, { mine: "1" });
    assert.deepEqual(host.get(CM, "team-a", "app-config")?.data, { color: "blue" });
    assert.ok(host.events.some((e) => e.reason === "NameConflict" && e.type === "warning"));
  });

  test("a missing namespace warns and requeues; its Namespace maps back to the source", () => {
    host.remove(kinds.Namespace, undefined, "team-b");
    host.put(source());
    assert.deepEqual(reconcile(), { tag: "requeue-after-ms", val: 300_000n });
    assert.ok(host.events.some((e) => e.reason === "NamespaceMissing"));
    const requests = reconciler.map(kinds.Namespace, new TextEncoder().encode(JSON.stringify(namespace("team-b"))));
    assert.deepEqual(requests, [{ namespace: "default", name: "app-config" }]);
  });

  test("a deleted copy is re-created (its reconcile is handed no object)", () => {
    host.put(source());
    reconcile();
    host.remove(CM, "team-a", "app-config");
    reconcile("team-a", "app-config");
    assert.deepEqual(host.get(CM, "team-a", "app-config")?.data, { color: "blue" });
  });

  test("a conflict on the copy's update is a retryable error", () => {
    host.put(source());
    reconcile();
    const src = host.get(CM, "default", "app-config")!;
    host.put({ ...src, data: { color: "green" } });
    host.failNext("replace", { tag: "conflict", val: "the copy changed" });
    assert.throws(
      () => reconcile(),
      (e: unknown) => {
        const payload = (e as { payload: { tag: string; val: string } }).payload;
        assert.equal(payload.tag, "retryable");
        assert.match(payload.val, /^updating copy team-a\/app-config: conflict: the copy changed/);
        return true;
      },
    );
  });

  test("bad settings are refused", () => {
    for (const bad of [{ namespaces: [] }, { namespaces: ["a"], typo: 1 }, {}]) {
      assert.throws(() => reconciler.init(host.settingsJson(bad)));
    }
  });
});

describe("the SDK on the fake host", () => {
  beforeEach(() => {
    host = new FakeHost().install();
  });

  test("a missing object is a not-found HostError; ignoreNotFound turns it into undefined", () => {
    assert.throws(
      () => client.replace({ apiVersion: "v1", kind: "ConfigMap", metadata: { name: "x", namespace: "d" } }),
      (e: unknown) => e instanceof HostError && e.isNotFound(),
    );
    assert.throws(() => client.delete(CM, "d", "x"), (e: unknown) => e instanceof HostError && e.isNotFound());
    assert.equal(
      ignoreNotFound(() => client.delete(CM, "d", "x")),
      undefined,
    );
    assert.deepEqual(host.writes, []);
  });

  test("reconcile is handed the cached object, or undefined once it is gone", () => {
    const seen: [string, ConfigMap | undefined][] = [];
    class Recorder {
      static forKind = kinds.ConfigMap;
      constructor(_settings: unknown) {}
      reconcile({ request, object }: Target<ConfigMap>): void {
        seen.push([request.name, object]);
      }
    }
    const exported = exportPlugin(Recorder);
    exported.init(host.settingsJson({}));
    const stored = host.put(source());
    exported.reconcile({ namespace: "default", name: "app-config" });
    exported.reconcile({ namespace: "default", name: "gone" });
    assert.deepEqual(seen, [
      ["app-config", stored],
      ["gone", undefined],
    ]);
  });

  test("a plugin class without forKind is refused at init", () => {
    class NoKind {
      constructor(_settings: unknown) {}
      reconcile(): void {}
    }
    const exported = exportPlugin(NoKind as unknown as PluginClass<unknown>);
    assert.throws(
      () => exported.init(host.settingsJson({})),
      (e: unknown) => String((e as { payload: unknown }).payload).includes("has no `static forKind`"),
    );
  });

  test("a failed cache read ends the reconcile before the plugin runs", () => {
    reconciler.init(host.settingsJson({ namespaces: ["team-a"] }));
    host.failNext("cache.get", { tag: "forbidden", val: "ConfigMap is not declared" });
    assert.throws(
      () => reconcile("default", "x"),
      (e: unknown) => {
        assert.deepEqual((e as { payload: unknown }).payload, {
          tag: "retryable",
          val: "reading ConfigMap default/x from the cache: forbidden: ConfigMap is not declared",
        });
        return true;
      },
    );
    assert.deepEqual(host.writes, []);
  });
});
