"""Fake of the DCGM bindings' pydcgm, answering like a host engine would; driven by $FAKE_DCGM_STATE (JSON):
{"up": true, "gpus": [0, 1], "blank": [1004]} - host engine reachable, its GPUs, fields that come back blank."""

import json
import os
from types import SimpleNamespace

import dcgm_structs

FP64_BLANK = 140737488355328.0


def _state():
    with open(os.environ["FAKE_DCGM_STATE"]) as stream:
        return json.load(stream)


def _check():
    if not _state().get("up"):
        raise dcgm_structs.DCGMError_ConnectionNotValid("Host engine connection invalid/disconnected")


def _value(field, gpu):
    if field <= 1008:
        return round(0.1 * (field - 1000) + 0.01 * gpu, 4)
    return 1_000_000 * (field - 1008) * (gpu + 1)


class DcgmHandle:
    def __init__(
        self, handle=None, ipAddress=None, opMode=None, persistAfterDisconnect=False, unixSocketPath=None, timeoutMs=0
    ):
        if ipAddress is None and unixSocketPath is None:
            raise AssertionError("an embedded host engine was asked for")
        _check()
        self.address = ipAddress

    def GetSystem(self):
        return SimpleNamespace(
            discovery=SimpleNamespace(
                GetGpuAttributes=lambda gpu: SimpleNamespace(
                    identifiers=SimpleNamespace(uuid=f"GPU-{gpu:08d}-0000-4000-8000-000000000000")
                )
            )
        )

    def Shutdown(self):
        pass


class _Samples:
    def __init__(self):
        self.watched = None

    def WatchFields(self, field_group, update_freq, max_keep_age, max_keep_samples):
        _check()
        self.watched = (field_group.fieldIds, update_freq)

    def GetLatest(self, field_group):
        _check()
        state = _state()
        values = {}
        for gpu in state.get("gpus", []):
            values[gpu] = {}
            for field in field_group.fieldIds:
                blank = field in state.get("blank", [])
                values[gpu][field] = [SimpleNamespace(value=FP64_BLANK if blank else _value(field, gpu), isBlank=blank)]
        return SimpleNamespace(values=values)


class DcgmGroup:
    def __init__(self, dcgmHandle, groupId=None, groupName=None, groupType=None):
        _check()
        self.samples = _Samples()

    def GetGpuIds(self):
        return list(_state().get("gpus", []))

    def Delete(self):
        pass


class DcgmFieldGroup:
    def __init__(self, dcgmHandle, name="", fieldIds=None, fieldGroupId=None):
        _check()
        self.fieldIds = list(fieldIds or [])

    def Delete(self):
        pass
