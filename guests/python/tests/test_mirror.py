"""The Python configmap-mirror and the SDK under it, natively against FakeHost: the
examples/EXPECTED.md rows that do not need a real API server."""

import json
import unittest

from componentize_py_types import Err
from wit_world.exports import reconciler as wit
from wit_world.imports import types

import app
from wasmctrl_guest import CONFIG_MAP, client, export_plugin
from wasmctrl_guest.testing import FakeHost

CM = ("v1", "ConfigMap")


def source(data=None, labels=None):
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "app-config", "namespace": "default", "labels": labels or {"mirror": "true"}},
        "data": data or {"color": "blue"},
    }


def namespace(name):
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


class MirrorTest(unittest.TestCase):
    def setUp(self):
        self.host = FakeHost(indexes={"by-source": "mirror.example.com/source"})
        self.host.install()
        for ns in ("default", "team-a", "team-b"):
            self.host.put(namespace(ns))
        self.r = app.Reconciler()
        info = self.r.init(json.dumps({"namespaces": ["team-a", "team-b"]}).encode())
        self.assertEqual(info.hooks, wit.Hooks.MAP)
        self.assertEqual((info.for_kind.api_version, info.for_kind.kind), CM)

    def reconcile(self, ns="default", name="app-config"):
        return self.r.reconcile(types.Request(namespace=ns, name=name))

    def test_copies_source_with_finalizer_and_event(self):
        self.host.put(source())
        self.assertIsInstance(self.reconcile(), wit.ReconcileResult_Done)
        src = self.host.get(*CM, "default", "app-config")
        self.assertIn(app.FINALIZER, src["metadata"]["finalizers"])
        for ns in ("team-a", "team-b"):
            copy = self.host.get(*CM, ns, "app-config")
            self.assertEqual(copy["data"], {"color": "blue"})
            self.assertEqual(copy["metadata"]["labels"], {app.MANAGED_BY_LABEL: app.MANAGED_BY})
            self.assertEqual(copy["metadata"]["annotations"], {app.SOURCE_ANNOTATION: "default/app-config"})
            self.assertNotIn("ownerReferences", copy["metadata"])
        [event] = self.host.events
        self.assertEqual((event.reason, event.action), ("Mirrored", "Sync"))
        self.assertTrue(event.note.startswith("copies created in [team-a, team-b]"), event.note)
        self.assertTrue(any(m == "mirrored default/app-config" and ("created", "team-a,team-b") in f for _, m, f in self.host.logs))

    def test_steady_state_writes_nothing(self):
        self.host.put(source())
        self.reconcile()
        self.host.writes.clear()
        self.host.events.clear()
        self.reconcile()
        self.assertEqual(self.host.writes, [])
        self.assertEqual(self.host.events, [])

    def test_removed_key_and_edited_copy_are_put_back(self):
        self.host.put(source({"a": "1", "b": "2"}))
        self.reconcile()
        src = self.host.get(*CM, "default", "app-config")
        src["data"] = {"a": "1"}
        self.host.put(src)
        copy = self.host.get(*CM, "team-a", "app-config")
        copy["data"] = {"a": "edited"}
        self.host.put(copy)
        self.reconcile()
        for ns in ("team-a", "team-b"):
            self.assertEqual(self.host.get(*CM, ns, "app-config")["data"], {"a": "1"})

    def test_unlabelled_source_loses_copies_and_finalizer(self):
        self.host.put(source())
        self.reconcile()
        src = self.host.get(*CM, "default", "app-config")
        src["metadata"]["labels"] = {}
        self.host.put(src)
        self.reconcile()
        self.assertIsNone(self.host.get(*CM, "team-a", "app-config"))
        self.assertIsNone(self.host.get(*CM, "team-b", "app-config"))
        self.assertNotIn(app.FINALIZER, self.host.get(*CM, "default", "app-config")["metadata"].get("finalizers", []))

    def test_deleted_source_is_cleaned_up_then_goes(self):
        self.host.put(source())
        self.reconcile()
        client.delete(CONFIG_MAP, "default", "app-config")  # marked: the finalizer holds it
        self.assertTrue(self.host.get(*CM, "default", "app-config")["metadata"]["deletionTimestamp"])
        self.reconcile()
        self.assertIsNone(self.host.get(*CM, "default", "app-config"))
        self.assertIsNone(self.host.get(*CM, "team-a", "app-config"))
        self.assertIn("CopiesDeleted", [e.reason for e in self.host.events])

    def test_foreign_configmap_is_left_alone_with_a_warning(self):
        self.host.put({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app-config", "namespace": "team-b"}, "data": {"mine": "1"}})
        self.host.put(source())
        self.reconcile()
        self.assertEqual(self.host.get(*CM, "team-b", "app-config")["data"], {"mine": "1"})
        self.assertEqual(self.host.get(*CM, "team-a", "app-config")["data"], {"color": "blue"})
        self.assertIn(("NameConflict", "warning"), [(e.reason, e.type.name.lower()) for e in self.host.events])

    def test_missing_namespace_warns_and_requeues(self):
        del self.host.objects[("v1", "Namespace", None, "team-b")]
        self.host.put(source())
        result = self.reconcile()
        self.assertEqual(result, wit.ReconcileResult_RequeueAfterMs(300_000))
        self.assertIn("NamespaceMissing", [e.reason for e in self.host.events])
        requests = self.r.map(types.Gvk("v1", "Namespace"), json.dumps(namespace("team-b")).encode())
        self.assertEqual(requests, [types.Request(namespace="default", name="app-config")])

    def test_deleted_copy_is_recreated(self):
        self.host.put(source())
        self.reconcile()
        del self.host.objects[("v1", "ConfigMap", "team-a", "app-config")]
        self.reconcile("team-a", "app-config")
        self.assertEqual(self.host.get(*CM, "team-a", "app-config")["data"], {"color": "blue"})

    def test_a_conflict_on_the_copy_update_is_retryable(self):
        self.host.put(source())
        self.reconcile()
        src = self.host.get(*CM, "default", "app-config")
        src["data"] = {"color": "green"}
        self.host.put(src)
        self.host.fail_next("replace", types.Error_Conflict("the copy changed"))
        with self.assertRaises(Err) as failed:
            self.reconcile()
        self.assertIsInstance(failed.exception.value, wit.ReconcileError_Retryable)
        self.assertTrue(failed.exception.value.value.startswith("updating copy team-a/app-config: conflict: the copy changed"), failed.exception.value)

    def test_settings_are_checked(self):
        for bad in ({"namespaces": []}, {"namespaces": ["a"], "typo": 1}, {}):
            with self.assertRaises(Err):
                app.Reconciler().init(json.dumps(bad).encode())


class SdkErrorTest(unittest.TestCase):
    def setUp(self):
        self.host = FakeHost()
        self.host.install()

    def test_host_errors_become_exceptions_and_reconcile_errors(self):
        from wasmctrl_guest import HostError, context, ignore_not_found
        from wasmctrl_guest.plugin import _reconcile_error

        with self.assertRaises(HostError) as caught:
            client.replace({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "d"}})
        self.assertTrue(caught.exception.not_found)
        self.assertEqual(str(caught.exception), "not found: ConfigMap d/x")
        with self.assertRaises(HostError) as gone:
            client.delete(CONFIG_MAP, "d", "x")
        self.assertTrue(gone.exception.not_found)
        self.assertIsNone(ignore_not_found(lambda: client.delete(CONFIG_MAP, "d", "x")))
        self.assertIsInstance(_reconcile_error(caught.exception), wit.ReconcileError_Retryable)
        invalid = HostError("invalid", "bad patch")
        self.assertEqual(_reconcile_error(invalid), wit.ReconcileError_Terminal("invalid: bad patch"))
        with self.assertRaises(Exception) as wrapped:
            with context("updating x"):
                raise invalid
        self.assertEqual(str(wrapped.exception), "updating x: invalid: bad patch")
        self.assertEqual(HostError("other", "teapot", 418).message, "HTTP 418: teapot")


class TargetTest(unittest.TestCase):
    """``reconcile`` is handed the cached object of ``for_kind``, or ``None`` once it is gone."""

    def setUp(self):
        self.host = FakeHost()
        self.host.install()
        self.seen = []
        seen = self.seen

        class Recorder:
            for_kind = CONFIG_MAP

            def __init__(self, settings):
                pass

            def reconcile(self, target):
                seen.append((target.request.namespace, target.request.name, target.object))

        self.Recorder = Recorder

    def test_present_and_gone(self):
        r = export_plugin(self.Recorder)()
        r.init(b"{}")
        stored = self.host.put(source())
        r.reconcile(types.Request(namespace="default", name="app-config"))
        r.reconcile(types.Request(namespace="default", name="gone"))
        self.assertEqual(self.seen, [("default", "app-config", stored), ("default", "gone", None)])

    def test_a_failed_cache_read_ends_the_call_before_the_plugin(self):
        from wit_world.imports import cache

        def refuse(kind, ns, name):
            raise Err(types.Error_Forbidden("ConfigMap is not declared"))

        cache.get = refuse
        r = export_plugin(self.Recorder)()
        r.init(b"{}")
        with self.assertRaises(Err) as failed:
            r.reconcile(types.Request(namespace="default", name="x"))
        self.assertEqual(
            failed.exception.value,
            wit.ReconcileError_Retryable("reading ConfigMap default/x from the cache: forbidden: ConfigMap is not declared"),
        )
        self.assertEqual(self.seen, [])

    def test_a_plugin_without_for_kind_is_refused(self):
        class NoKind:
            def __init__(self, settings):
                pass

            def reconcile(self, target):
                pass

        with self.assertRaises(Err) as refused:
            export_plugin(NoKind)().init(b"{}")
        self.assertIn("has no `for_kind`", refused.exception.value)


if __name__ == "__main__":
    unittest.main()
