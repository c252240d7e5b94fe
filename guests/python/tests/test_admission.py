"""The SDK's admission exports natively against FakeHost: a validation's refusal and
warnings, a mutation's patch, a host error's refusal, and the JSON diff."""

import json
import unittest

from wit_world.imports import admission as wit
from wit_world.imports import types

from wasmctrl_guest import CONFIG_MAP, Action, HostError, export_plugin
from wasmctrl_guest.testing import FakeHost
from wasmctrl_guest.admission import Denied, diff, export_mutator, export_validator


class Policy:
    for_kind = CONFIG_MAP

    def __init__(self, settings):
        pass

    def reconcile(self, target):
        return Action.DONE

    def validate(self, request):
        request.warn("checked")
        if "deny" in (request.object or {}).get("data", {}):
            raise Denied.invalid("data.deny is set")
        if "host-error" in (request.object or {}).get("data", {}):
            raise HostError("unavailable", "cache down")

    def mutate(self, request):
        request.object.setdefault("metadata", {}).setdefault("labels", {})["tier"] = "web"
        request.object["metadata"].pop("annotations", None)


def review(operation, obj, old=None):
    return wit.AdmissionRequest(
        uid="u",
        kind=types.Gvk(api_version="v1", kind="ConfigMap"),
        resource="configmaps",
        sub_resource=None,
        name="a",
        namespace="default",
        operation=operation,
        user_info=wit.UserInfo(username="alice", uid="", groups=["devs"], extra=[]),
        object=None if obj is None else json.dumps(obj).encode(),
        old_object=None if old is None else json.dumps(old).encode(),
        dry_run=False,
        options=None,
    )


CM = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "annotations": {"x": "y"}}, "data": {}}


class AdmissionTest(unittest.TestCase):
    def setUp(self):
        self.host = FakeHost()
        self.host.install()
        export_plugin(Policy)().init(b"{}")
        self.validator = export_validator(Policy)()
        self.mutator = export_mutator(Policy)()

    def test_a_denial_carries_its_code_and_the_warnings(self):
        v = self.validator.validate(review(wit.Operation.CREATE, {**CM, "data": {"deny": "1"}}))
        self.assertEqual((v.denial.message, v.denial.code), ("data.deny is set", 422))
        self.assertEqual(v.warnings, ["checked"])
        self.assertIsNone(self.validator.validate(review(wit.Operation.CREATE, CM)).denial)

    def test_a_host_error_refuses_with_code_500(self):
        v = self.validator.validate(review(wit.Operation.CREATE, {**CM, "data": {"host-error": "1"}}))
        self.assertEqual(v.denial.code, 500)
        self.assertIn("cache down", v.denial.message)

    def test_a_mutation_is_the_patch_of_what_changed(self):
        m = self.mutator.mutate(review(wit.Operation.CREATE, CM))
        self.assertIsNone(m.verdict.denial)
        ops = json.loads(m.patch)
        self.assertIn({"op": "add", "path": "/metadata/labels", "value": {"tier": "web"}}, ops)
        self.assertIn({"op": "remove", "path": "/metadata/annotations"}, ops)
        # A delete is admitted unchanged.
        m = self.mutator.mutate(review(wit.Operation.DELETE, None, CM))
        self.assertIsNone(m.patch)

    def test_diff_escapes_pointers_and_replaces_lists_whole(self):
        self.assertEqual(diff({"a/b": 1, "l": [1]}, {"a/b": 2, "l": [1, 2]}), [
            {"op": "replace", "path": "/a~1b", "value": 2},
            {"op": "replace", "path": "/l", "value": [1, 2]},
        ])
        self.assertEqual(diff({"x": {"y": 1}}, {"x": {"y": 1}}), [])


if __name__ == "__main__":
    unittest.main()
