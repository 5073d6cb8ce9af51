"""One exception family for everything a user can get wrong; the CLI prints it as one line."""


class PipelineError(Exception):
    """Base class: message is a single line that names the fix."""


class ConfigError(PipelineError):
    pass


class DataError(PipelineError):
    pass


class CheckpointError(PipelineError):
    pass


class TrainingError(PipelineError):
    pass


class RunDirError(PipelineError):
    pass
