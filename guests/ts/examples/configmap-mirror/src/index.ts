/**
 * `configmap-mirror` in TypeScript: the same behaviour as the Rust example
 * (guests/examples/configmap-mirror), so examples/EXPECTED.md applies unchanged.
 *
 * Copies every ConfigMap labelled `mirror=true` into the namespaces of `[settings]
 * namespaces`, keeps the copies in sync, and deletes them when the source goes away or
 * loses the label. Each copy names its source in the annotation `mirror.example.com/source`
 * (indexed as `by-source` in the TOML: owner references cannot cross namespaces), and the
 * source carries the finalizer `mirror.example.com/cleanup` until its copies are deleted.
 *
 * Invariants kept by `reconcile`:
 * - a copy exists in every listed namespace (other than the source's own) that exists,
 *   with exactly the source's `data`, `binaryData` and `immutable`;
 * - a ConfigMap this plugin did not create is never overwritten (Warning `NameConflict`);
 * - a copy whose source is gone, unlabelled, or whose namespace is no longer listed is
 *   deleted; a live labelled source carries the finalizer, nothing else does.
 */
import {
  Action,
  HostError,
  annotation,
  cache,
  client,
  events,
  exportPlugin,
  finalizers,
  ignoreNotFound,
  isBeingDeleted,
  isKind,
  keyOf,
  kinds,
  label,
  log,
  requestFor,
  withContext,
  type ConfigMap,
  type Gvk,
  type KubeObject,
  type Request,
  type Target,
} from "@wasmctrl/guest";

export const MIRROR_LABEL = "mirror";
export const SOURCE_ANNOTATION = "mirror.example.com/source";
export const MANAGED_BY_LABEL = "app.kubernetes.io/managed-by";
export const MANAGED_BY = "configmap-mirror";
export const FINALIZER = "mirror.example.com/cleanup";
export const BY_SOURCE_INDEX = "by-source";

/** `[settings]`. */
interface Settings {
  namespaces: string[];
}

/** Whether `cm` is a mirror source (labelled `mirror=true`, and not itself a copy). */
export function isSource(cm: ConfigMap): boolean {
  return label(cm, MIRROR_LABEL) === "true" && annotation(cm, SOURCE_ANNOTATION) === undefined;
}

/** The copy of `source` that belongs in `namespace`. */
export function desiredCopy(source: ConfigMap, namespace: string): ConfigMap {
  const copy: ConfigMap = {
    apiVersion: "v1",
    kind: "ConfigMap",
    metadata: {
      name: source.metadata.name,
      namespace,
      labels: { [MANAGED_BY_LABEL]: MANAGED_BY },
      annotations: { [SOURCE_ANNOTATION]: keyOf(source) },
    },
  };
  if (source.data !== undefined) copy.data = source.data;
  if (source.binaryData !== undefined) copy.binaryData = source.binaryData;
  if (source.immutable !== undefined) copy.immutable = source.immutable;
  return copy;
}

/** `existing` brought in line with `source`, or `undefined` when it already is. */
export function updatedCopy(existing: ConfigMap, source: ConfigMap): ConfigMap | undefined {
  const copy = JSON.parse(JSON.stringify(existing)) as ConfigMap;
  setOrDelete(copy, "data", source.data);
  setOrDelete(copy, "binaryData", source.binaryData);
  setOrDelete(copy, "immutable", source.immutable);
  copy.metadata.labels = { ...(copy.metadata.labels ?? {}), [MANAGED_BY_LABEL]: MANAGED_BY };
  copy.metadata.annotations = { ...(copy.metadata.annotations ?? {}), [SOURCE_ANNOTATION]: keyOf(source) };
  return sameJson(copy, existing) ? undefined : copy;
}

function setOrDelete(o: ConfigMap, field: "data" | "binaryData" | "immutable", value: unknown): void {
  if (value === undefined || value === null) {
    delete o[field];
  } else {
    (o as Record<string, unknown>)[field] = value;
  }
}

/** Structural equality of two JSON values (key order ignored). */
function sameJson(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a).filter((k) => (a as Record<string, unknown>)[k] !== undefined);
  const kb = Object.keys(b).filter((k) => (b as Record<string, unknown>)[k] !== undefined);
  if (ka.length !== kb.length) return false;
  return ka.every((k) => sameJson((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k]));
}

interface SyncReport {
  created: string[];
  updated: string[];
  unchanged: string[];
  deleted: string[];
  conflicts: string[];
  missingNamespaces: string[];
}

class Mirror {
  static forKind = kinds.ConfigMap;
  private readonly namespaces: string[];

  constructor(settings: Settings) {
    const unknown = Object.keys(settings ?? {}).filter((k) => k !== "namespaces");
    if (unknown.length > 0) {
      throw new Error(`[settings]: unknown field \`${unknown[0]}\`, expected \`namespaces\``);
    }
    if (!Array.isArray(settings.namespaces) || settings.namespaces.some((n) => typeof n !== "string")) {
      throw new Error("[settings] namespaces must be a list of namespace names");
    }
    if (settings.namespaces.length === 0) {
      throw new Error("[settings] namespaces must list at least one namespace");
    }
    this.namespaces = settings.namespaces;
  }

  /** The namespaces a source in `sourceNamespace` is copied into: sorted, deduplicated, not its own. */
  targetsFor(sourceNamespace: string): string[] {
    return [...new Set(this.namespaces.filter((ns) => ns !== sourceNamespace))].sort();
  }

  reconcile({ request, object: cm }: Target<ConfigMap>): Action {
    if (cm === undefined) {
      return this.reconcileMissing(request);
    }
    const sourceKey = annotation(cm, SOURCE_ANNOTATION);
    if (sourceKey !== undefined) {
      return label(cm, MANAGED_BY_LABEL) === MANAGED_BY ? this.reconcileCopy(cm, sourceKey) : Action.done;
    }
    if (!isSource(cm) || isBeingDeleted(cm)) {
      return this.cleanup(cm);
    }
    const source = withContext("adding finalizer", () => finalizers.ensureAdded(cm, FINALIZER));
    return this.sync(source);
  }

  /** A Namespace appeared or changed: every source that targets it needs a pass. */
  map(kind: Gvk, object: KubeObject): Request[] {
    if (!isKind(kind, kinds.Namespace)) return [];
    const ns = object.metadata.name ?? "";
    if (!this.namespaces.includes(ns)) return [];
    try {
      return cache
        .list(kinds.ConfigMap, { labelSelector: "mirror=true" })
        .filter(isSource)
        .map(requestFor);
    } catch (e) {
      log.warn("listing mirror sources failed", { namespace: ns, error: e });
      return [];
    }
  }

  /**
   * Brings the copies of `source` in `only` (every target namespace when undefined) in line.
   * The source's own reconcile syncs every target and deletes stale copies; a copy's reconcile
   * touches that copy alone, so it never races the source's reconcile over the other copies
   * (two keys are reconciled side by side with `concurrency = 2`).
   */
  private sync(source: ConfigMap, only?: string): Action {
    const sourceNs = source.metadata.namespace ?? "";
    const name = source.metadata.name ?? "";
    const key = keyOf(source);
    const allTargets = this.targetsFor(sourceNs);
    const targets = only === undefined ? allTargets : allTargets.filter((ns) => ns === only);
    const r: SyncReport = { created: [], updated: [], unchanged: [], deleted: [], conflicts: [], missingNamespaces: [] };

    for (const ns of targets) {
      const existing = cache.get(kinds.ConfigMap, ns, name);
      if (existing !== undefined) {
        if (annotation(existing, SOURCE_ANNOTATION) !== key) {
          r.conflicts.push(ns);
          continue;
        }
        const update = updatedCopy(existing, source);
        if (update === undefined) {
          r.unchanged.push(ns);
        } else if (existing.immutable === true) {
          // An immutable copy cannot change: delete it, the next pass re-creates it.
          withContext(`deleting immutable copy ${ns}/${name}`, () =>
            ignoreNotFound(() =>
              client.delete(kinds.ConfigMap, ns, name, {
                uid: existing.metadata.uid,
                resourceVersion: existing.metadata.resourceVersion,
              }),
            ),
          );
          r.deleted.push(ns);
        } else {
          withContext(`updating copy ${ns}/${name}`, () => client.replace(update));
          r.updated.push(ns);
        }
      } else if (cache.get(kinds.Namespace, undefined, ns) === undefined) {
        r.missingNamespaces.push(ns);
      } else {
        try {
          client.create(desiredCopy(source, ns));
          r.created.push(ns);
        } catch (e) {
          // The cache was behind; the next pass (from the copy's add event) checks it.
          if (e instanceof HostError && e.isAlreadyExists()) {
            r.unchanged.push(ns);
          } else {
            throw e;
          }
        }
      }
    }

    // Copies in namespaces no longer listed (settings changed): the source's own pass.
    const stale = only === undefined ? cache.byIndex(kinds.ConfigMap, BY_SOURCE_INDEX, key) : [];
    for (const copy of stale) {
      const ns = copy.metadata.namespace ?? "";
      if (!allTargets.includes(ns) && annotation(copy, SOURCE_ANNOTATION) === key) {
        withContext(`deleting stale copy ${ns}/${name}`, () =>
          ignoreNotFound(() => client.delete(kinds.ConfigMap, ns, name)),
        );
        r.deleted.push(ns);
      }
    }

    this.record(source, r);
    if (r.missingNamespaces.length > 0) {
      // The Namespace watch re-enqueues us when one appears; this is a safety net.
      return Action.requeueAfter(300_000);
    }
    return Action.done;
  }

  private record(source: ConfigMap, r: SyncReport): void {
    const key = keyOf(source);
    if (r.created.length + r.updated.length + r.deleted.length > 0) {
      const note =
        `copies created in [${r.created.join(", ")}], updated in [${r.updated.join(", ")}], ` +
        `deleted from [${r.deleted.join(", ")}]`;
      events.normal(source, "Mirrored", "Sync", note);
    }
    for (const ns of r.conflicts) {
      events.warning(
        source,
        "NameConflict",
        "Sync",
        `${ns}/${source.metadata.name} exists and is not a copy of ${key}; left untouched`,
      );
    }
    for (const ns of r.missingNamespaces) {
      events.warning(source, "NamespaceMissing", "Sync", `target namespace ${ns} does not exist`);
    }
    log.info(`mirrored ${key}`, {
      created: r.created,
      updated: r.updated,
      unchanged: r.unchanged,
      deleted: r.deleted,
      conflicts: r.conflicts,
      missing_namespaces: r.missingNamespaces,
    });
  }

  /** Deletes every copy of `sourceKey` (by the `by-source` index). Returns their namespaces. */
  private deleteCopies(sourceKey: string): string[] {
    const deleted: string[] = [];
    for (const copy of cache.byIndex(kinds.ConfigMap, BY_SOURCE_INDEX, sourceKey)) {
      const ns = copy.metadata.namespace ?? "";
      const name = copy.metadata.name ?? "";
      withContext(`deleting copy ${ns}/${name}`, () =>
        ignoreNotFound(() => client.delete(kinds.ConfigMap, ns, name, { uid: copy.metadata.uid })),
      );
      deleted.push(ns);
    }
    return deleted;
  }

  /** The source is being deleted or lost its label: delete its copies, then let it go. */
  private cleanup(source: ConfigMap): Action {
    const deleted = this.deleteCopies(keyOf(source));
    const had = finalizers.has(source, FINALIZER);
    if (had) {
      if (deleted.length > 0) {
        events.normal(source, "CopiesDeleted", "Cleanup", `deleted copies in [${deleted.join(", ")}]`);
      }
      withContext("removing finalizer", () => finalizers.ensureRemoved(source, FINALIZER));
    }
    if (deleted.length > 0 || had) {
      log.info(`cleaned up copies of ${keyOf(source)}`, { deleted, deleting: isBeingDeleted(source) });
    }
    return Action.done;
  }

  /** A copy changed (or was re-listed): bring it in line with its source, or delete it. */
  private reconcileCopy(copy: ConfigMap, sourceKey: string): Action {
    const slash = sourceKey.indexOf("/");
    const [sourceNs, sourceName] = slash < 0 ? ["", sourceKey] : [sourceKey.slice(0, slash), sourceKey.slice(slash + 1)];
    const source = cache.get(kinds.ConfigMap, sourceNs, sourceName);
    if (
      source !== undefined &&
      isSource(source) &&
      !isBeingDeleted(source) &&
      source.metadata.name === copy.metadata.name &&
      this.targetsFor(sourceNs).includes(copy.metadata.namespace ?? "")
    ) {
      return this.sync(source, copy.metadata.namespace ?? "");
    }
    withContext(`deleting orphaned copy ${keyOf(copy)}`, () =>
      ignoreNotFound(() =>
        client.delete(kinds.ConfigMap, copy.metadata.namespace, copy.metadata.name ?? "", { uid: copy.metadata.uid }),
      ),
    );
    log.info(`deleted orphaned copy ${keyOf(copy)}`, { source: sourceKey });
    return Action.done;
  }

  /** Nothing cached under this key: a deleted source or a deleted copy (to re-create). */
  private reconcileMissing(request: Request): Action {
    const key = keyOf(request);
    const deleted = this.deleteCopies(key);
    if (deleted.length > 0) {
      log.info(`deleted copies of vanished source ${key}`, { deleted });
    }
    const ns = request.namespace;
    if (ns === undefined) return Action.done;
    let action = Action.done;
    for (const source of cache.list(kinds.ConfigMap, { labelSelector: "mirror=true" })) {
      if (
        source.metadata.name === request.name &&
        isSource(source) &&
        !isBeingDeleted(source) &&
        this.targetsFor(source.metadata.namespace ?? "").includes(ns)
      ) {
        log.info(`re-creating deleted copy ${key}`, { source: keyOf(source) });
        action = this.sync(source, ns);
      }
    }
    return action;
  }
}

export const reconciler = exportPlugin(Mirror);
