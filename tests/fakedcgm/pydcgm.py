"""Fake of the DCGM bindings' pydcgm, answering like a host engine would; driven by $FAKE_DCGM_STATE (JSON):
{"up": true, "gpus": [0, 1], "blank": [1004]} - host engine reachable, its GPUs, fields that come back blank;
"incidents": [{"gpu": 0, "system": 16, "health": 20, "code": 28, "msg": "..."}] - what the next health checks report
(entity group "group", default 1, a GPU; DCGM's structures: c_dcgmHealthResponse_v4, c_dcgmIncidentInfo_t)."""

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


class _Health:
    """DcgmGroupHealth: the first Check() after Set() only starts the watches, as DCGM's does."""

    def __init__(self):
        self.watched = None
        self.checks = 0

    def Set(self, systems, updateInterval=None, maxKeepAge=None):
        _check()
        self.watched = systems

    def Check(self, version=None):
        _check()
        if self.watched is None:
            raise dcgm_structs.DCGMError("health watches not set")
        self.checks += 1
        incidents = [] if self.checks == 1 else _state().get("incidents", [])
        return SimpleNamespace(
            overallHealth=max((i["health"] for i in incidents), default=0),
            incidentCount=len(incidents),
            incidents=[
                SimpleNamespace(
                    system=i["system"],
                    health=i["health"],
                    error=SimpleNamespace(msg=i.get("msg", "").encode(), code=i.get("code", 0)),
                    entityInfo=SimpleNamespace(entityGroupId=i.get("group", 1), entityId=i["gpu"]),
                )
                for i in incidents
            ],
        )


class DcgmGroup:
    def __init__(self, dcgmHandle, groupId=None, groupName=None, groupType=None):
        _check()
        self.samples = _Samples()
        self.health = _Health()

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
