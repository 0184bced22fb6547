"""The one exception type that every entry point reports as a clear one-line error (exit 2, or an
HTTP 4xx): input the user gave is wrong. Its message names what is wrong and where."""


class UserError(ValueError):
    pass
