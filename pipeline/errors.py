"""One exception family for everything a user can get wrong; the CLI prints it as one line."""


class PipelineError(Exception):
    """Base class: message is a single line that names the fix."""


class ConfigError(PipelineError):
    pass


class DeviceError(ConfigError):
    """A device name that is no device, or one this machine does not have; the message spells the setting as the user
    wrote it (`device=`, `verify.device=`, `--device `)."""


class DataError(PipelineError):
    pass


class CheckpointError(PipelineError):
    """A checkpoint that is missing, corrupt or does not fit; `path` names it (None when unknown)."""

    def __init__(self, message: str, path=None):
        super().__init__(message)
        self.path = path


class TrainingError(PipelineError):
    pass


class RunDirError(PipelineError):
    pass
