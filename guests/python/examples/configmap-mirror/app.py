"""``configmap-mirror`` in Python: the same behaviour as the Rust example
(guests/examples/configmap-mirror), so examples/EXPECTED.md applies unchanged.

Copies every ConfigMap labelled ``mirror=true`` into the namespaces of ``[settings]
namespaces``, keeps the copies in sync, and deletes them when the source goes away or loses
the label. Each copy names its source in the annotation ``mirror.example.com/source``
(indexed as ``by-source`` in the TOML: owner references cannot cross namespaces), and the
source carries the finalizer ``mirror.example.com/cleanup`` until its copies are deleted.

Invariants kept by ``reconcile``:
- a copy exists in every listed namespace (other than the source's own) that exists, with
  exactly the source's ``data``, ``binaryData`` and ``immutable``;
- a ConfigMap this plugin did not create is never overwritten (Warning ``NameConflict``);
- a copy whose source is gone, unlabelled, or whose namespace is no longer listed is
  deleted; a live labelled source carries the finalizer, nothing else does.
"""

from __future__ import annotations

import copy as _copy
from dataclasses import dataclass, field
from typing import List, Optional

from wasmctrl_guest import (
    CONFIG_MAP,
    NAMESPACE,
    Action,
    ConfigMap,
    Gvk,
    HostError,
    KubeObject,
    Request,
    Target,
    annotation,
    cache,
    client,
    context,
    events,
    export_plugin,
    finalizers,
    ignore_not_found,
    is_being_deleted,
    key,
    label,
    log,
    meta,
    name,
    namespace,
    request_for,
)

MIRROR_LABEL = "mirror"
SOURCE_ANNOTATION = "mirror.example.com/source"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "configmap-mirror"
FINALIZER = "mirror.example.com/cleanup"
BY_SOURCE_INDEX = "by-source"
_COPIED_FIELDS = ("data", "binaryData", "immutable")


def is_source(cm: ConfigMap) -> bool:
    """Whether ``cm`` is a mirror source (labelled ``mirror=true``, and not itself a copy)."""
    return label(cm, MIRROR_LABEL) == "true" and annotation(cm, SOURCE_ANNOTATION) is None


def desired_copy(source: ConfigMap, ns: str) -> ConfigMap:
    """The copy of ``source`` that belongs in ``ns``."""
    copy: ConfigMap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name(source),
            "namespace": ns,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            "annotations": {SOURCE_ANNOTATION: key(source)},
        },
    }
    for f in _COPIED_FIELDS:
        if source.get(f) is not None:
            copy[f] = source[f]  # type: ignore[literal-required]
    return copy


def updated_copy(existing: ConfigMap, source: ConfigMap) -> Optional[ConfigMap]:
    """``existing`` brought in line with ``source``, or ``None`` when it already is. Keeps
    whatever else is on the copy (other labels and annotations, resourceVersion for the CAS)."""
    copy = _copy.deepcopy(existing)
    for f in _COPIED_FIELDS:
        if source.get(f) is None:
            copy.pop(f, None)  # type: ignore[misc]
        else:
            copy[f] = source[f]  # type: ignore[literal-required]
    m = copy.setdefault("metadata", {})
    m["labels"] = {**(m.get("labels") or {}), MANAGED_BY_LABEL: MANAGED_BY}
    m["annotations"] = {**(m.get("annotations") or {}), SOURCE_ANNOTATION: key(source)}
    return None if copy == existing else copy


def request_key(request: Request) -> str:
    return f"{request.namespace}/{request.name}" if request.namespace else request.name


@dataclass
class SyncReport:
    created: List[str] = field(default_factory=list)
    updated: List[str] = field(default_factory=list)
    unchanged: List[str] = field(default_factory=list)
    deleted: List[str] = field(default_factory=list)
    conflicts: List[str] = field(default_factory=list)
    missing_namespaces: List[str] = field(default_factory=list)


class Mirror:
    for_kind = CONFIG_MAP

    def __init__(self, settings: dict) -> None:
        unknown = [k for k in settings if k != "namespaces"]
        if unknown:
            raise ValueError(f"[settings]: unknown field `{unknown[0]}`, expected `namespaces`")
        namespaces = settings.get("namespaces")
        if not isinstance(namespaces, list) or not all(isinstance(n, str) for n in namespaces):
            raise ValueError("[settings] namespaces must be a list of namespace names")
        if not namespaces:
            raise ValueError("[settings] namespaces must list at least one namespace")
        self.namespaces: List[str] = namespaces

    def targets_for(self, source_namespace: str) -> List[str]:
        """The namespaces a source in ``source_namespace`` is copied into: sorted, deduplicated, not its own."""
        return sorted({ns for ns in self.namespaces if ns != source_namespace})

    def reconcile(self, target: Target) -> Action:
        cm: Optional[ConfigMap] = target.object
        if cm is None:
            return self.reconcile_missing(target.request)
        source_key = annotation(cm, SOURCE_ANNOTATION)
        if source_key is not None:
            if label(cm, MANAGED_BY_LABEL) == MANAGED_BY:
                return self.reconcile_copy(cm, source_key)
            return Action.DONE
        if not is_source(cm) or is_being_deleted(cm):
            return self.cleanup(cm)
        with context("adding finalizer"):
            source = finalizers.ensure_added(cm, FINALIZER)
        return self.sync(source)

    def map(self, kind: Gvk, obj: KubeObject) -> List[Request]:
        """A Namespace appeared or changed: every source that targets it needs a pass."""
        if not NAMESPACE.matches(kind):
            return []
        ns = name(obj)
        if ns not in self.namespaces:
            return []
        try:
            sources = cache.list_objects(CONFIG_MAP, label_selector="mirror=true")
        except HostError as e:
            log.warn("listing mirror sources failed", namespace=ns, error=e)
            return []
        return [request_for(s) for s in sources if is_source(s)]

    def sync(self, source: ConfigMap, only: Optional[str] = None) -> Action:
        """Brings the copies of ``source`` in ``only`` (every target namespace when ``None``) in line.

        The source's own reconcile syncs every target and deletes stale copies; a copy's
        reconcile touches that copy alone, so it never races the source's reconcile over the
        other copies (two keys are reconciled side by side with ``concurrency = 2``)."""
        source_ns = namespace(source) or ""
        nm = name(source)
        src_key = key(source)
        all_targets = self.targets_for(source_ns)
        targets = all_targets if only is None else [ns for ns in all_targets if ns == only]
        r = SyncReport()

        for ns in targets:
            existing = cache.get(CONFIG_MAP, ns, nm)
            if existing is not None:
                if annotation(existing, SOURCE_ANNOTATION) != src_key:
                    r.conflicts.append(ns)
                    continue
                update = updated_copy(existing, source)
                if update is None:
                    r.unchanged.append(ns)
                elif existing.get("immutable") is True:
                    # An immutable copy cannot change: delete it, the next pass re-creates it.
                    with context(f"deleting immutable copy {ns}/{nm}"):
                        ignore_not_found(
                            lambda: client.delete(
                                CONFIG_MAP,
                                ns,
                                nm,
                                uid=meta(existing).get("uid"),
                                resource_version=meta(existing).get("resourceVersion"),
                            )
                        )
                    r.deleted.append(ns)
                else:
                    with context(f"updating copy {ns}/{nm}"):
                        client.replace(update)
                    r.updated.append(ns)
            elif cache.get(NAMESPACE, None, ns) is None:
                r.missing_namespaces.append(ns)
            else:
                try:
                    client.create(desired_copy(source, ns))
                    r.created.append(ns)
                except HostError as e:
                    # The cache was behind; the next pass (from the copy's add event) checks it.
                    if not e.already_exists:
                        raise
                    r.unchanged.append(ns)

        # Copies in namespaces no longer listed (settings changed): the source's own pass.
        stale = cache.by_index(CONFIG_MAP, BY_SOURCE_INDEX, src_key) if only is None else []
        for copy in stale:
            ns = namespace(copy) or ""
            if ns not in all_targets and annotation(copy, SOURCE_ANNOTATION) == src_key:
                with context(f"deleting stale copy {ns}/{nm}"):
                    ignore_not_found(lambda: client.delete(CONFIG_MAP, ns, nm))
                r.deleted.append(ns)

        self.record(source, r)
        if r.missing_namespaces:
            # The Namespace watch re-enqueues us when one appears; this is a safety net.
            return Action.after(300_000)
        return Action.DONE

    def record(self, source: ConfigMap, r: SyncReport) -> None:
        src_key = key(source)
        if r.created or r.updated or r.deleted:
            note = (
                f"copies created in [{', '.join(r.created)}], updated in [{', '.join(r.updated)}], "
                f"deleted from [{', '.join(r.deleted)}]"
            )
            events.normal(source, "Mirrored", "Sync", note)
        for ns in r.conflicts:
            events.warning(
                source, "NameConflict", "Sync", f"{ns}/{name(source)} exists and is not a copy of {src_key}; left untouched"
            )
        for ns in r.missing_namespaces:
            events.warning(source, "NamespaceMissing", "Sync", f"target namespace {ns} does not exist")
        log.info(
            f"mirrored {src_key}",
            created=r.created,
            updated=r.updated,
            unchanged=r.unchanged,
            deleted=r.deleted,
            conflicts=r.conflicts,
            missing_namespaces=r.missing_namespaces,
        )

    def delete_copies(self, source_key: str) -> List[str]:
        """Deletes every copy of ``source_key`` (by the ``by-source`` index). Returns their namespaces."""
        deleted = []
        for copy in cache.by_index(CONFIG_MAP, BY_SOURCE_INDEX, source_key):
            ns = namespace(copy) or ""
            with context(f"deleting copy {ns}/{name(copy)}"):
                ignore_not_found(lambda: client.delete(CONFIG_MAP, ns, name(copy), uid=meta(copy).get("uid")))
            deleted.append(ns)
        return deleted

    def cleanup(self, source: ConfigMap) -> Action:
        """The source is being deleted or lost its label: delete its copies, then let it go."""
        deleted = self.delete_copies(key(source))
        had = finalizers.has(source, FINALIZER)
        if had:
            if deleted:
                events.normal(source, "CopiesDeleted", "Cleanup", f"deleted copies in [{', '.join(deleted)}]")
            with context("removing finalizer"):
                finalizers.ensure_removed(source, FINALIZER)
        if deleted or had:
            log.info(f"cleaned up copies of {key(source)}", deleted=deleted, deleting=is_being_deleted(source))
        return Action.DONE

    def reconcile_copy(self, copy: ConfigMap, source_key: str) -> Action:
        """A copy changed (or was re-listed): bring it in line with its source, or delete it."""
        source_ns, _, source_name = source_key.rpartition("/")
        source = cache.get(CONFIG_MAP, source_ns, source_name)
        if (
            source is not None
            and is_source(source)
            and not is_being_deleted(source)
            and name(source) == name(copy)
            and (namespace(copy) or "") in self.targets_for(source_ns)
        ):
            return self.sync(source, namespace(copy) or "")
        with context(f"deleting orphaned copy {key(copy)}"):
            ignore_not_found(lambda: client.delete(CONFIG_MAP, namespace(copy), name(copy), uid=meta(copy).get("uid")))
        log.info(f"deleted orphaned copy {key(copy)}", source=source_key)
        return Action.DONE

    def reconcile_missing(self, request: Request) -> Action:
        """Nothing cached under this key: a deleted source or a deleted copy (to re-create)."""
        req_key = request_key(request)
        deleted = self.delete_copies(req_key)
        if deleted:
            log.info(f"deleted copies of vanished source {req_key}", deleted=deleted)
        ns = request.namespace
        if ns is None:
            return Action.DONE
        action = Action.DONE
        for source in cache.list_objects(CONFIG_MAP, label_selector="mirror=true"):
            if (
                name(source) == request.name
                and is_source(source)
                and not is_being_deleted(source)
                and ns in self.targets_for(namespace(source) or "")
            ):
                log.info(f"re-creating deleted copy {req_key}", source=key(source))
                action = self.sync(source, ns)
        return action


Reconciler = export_plugin(Mirror)
