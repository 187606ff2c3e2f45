"""Fake of the DCGM bindings' dcgm_structs, the part accelmon uses. State: $FAKE_DCGM_STATE (JSON)."""

DCGM_OPERATION_MODE_AUTO = 1
DCGM_GROUP_DEFAULT = 0


class DCGMError(Exception):
    pass


class DCGMError_ConnectionNotValid(DCGMError):
    pass


DCGM_HEALTH_WATCH_ALL = 0xFFFFFFFF
DCGM_FE_GPU = 1
DCGM_FE_SWITCH = 3
