"""Exceptions raised for library failures.

Bad attribute values and shapes raise ``ValueError``; bad dtypes and types raise
``TypeError``. What oneDNN itself refuses raises :class:`OneDNNError`, which keeps the
library's ``dnnl_status_t`` value.
"""

from __future__ import annotations

#: dnnl_status_t values, for messages and for ``OneDNNError.status_name``.
STATUS_NAMES = {
    0: "success",
    1: "out_of_memory",
    2: "invalid_arguments",
    3: "unimplemented",
    4: "last_impl_reached",
    5: "runtime_error",
    6: "not_required",
    7: "invalid_graph",
    8: "invalid_graph_op",
    9: "invalid_shape",
    10: "invalid_data_type",
}


class OneDNNError(RuntimeError):
    """oneDNN refused or failed an operation.

    Attributes:
        status: the ``dnnl_status_t`` value oneDNN returned (e.g. 2 = invalid_arguments).
    """

    def __init__(self, message: str, status: int) -> None:
        super().__init__(f"{message} (oneDNN status {status}: {STATUS_NAMES.get(status, '?')})")
        self.message = message
        self.status = status

    def __reduce__(self) -> tuple[type, tuple[str, int]]:
        return (type(self), (self.message, self.status))

    @property
    def status_name(self) -> str:
        """The name of :attr:`status` (``"unimplemented"``, ...)."""
        return STATUS_NAMES.get(self.status, "unknown")


class UnsupportedError(OneDNNError):
    """oneDNN has no kernel for this problem on this CPU (status ``unimplemented``)."""
