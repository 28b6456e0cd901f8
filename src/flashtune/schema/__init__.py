"""Op schemas: every public op declares its contract and can emit it as a Definition.

Example::

    RMSNORM = OpSchema(
        op_type="rmsnorm",
        name_prefix="rmsnorm",
        axes={"batch_size": Var("rows"), "hidden_size": Const("hidden size", abbrev="h")},
        inputs={
            "hidden_states": Tensor(["batch_size", "hidden_size"], dtype_from="input", param="input"),
            "weight": Tensor(["hidden_size"], dtype_from="input"),
        },
        outputs={"output": Tensor(["batch_size", "hidden_size"], dtype_from="input")},
        reference=rmsnorm_ref,
        bound=("eps",),
    )

    @api(schema=RMSNORM)
    def rmsnorm(input, weight, eps=1e-6, out=None): ...

    rmsnorm.definition(x, w).name  # "rmsnorm_h4096": built from shapes, no kernel runs
"""

from flashtune.schema.api import (
    NOT_HANDLED,
    REGISTRY,
    ApiOp,
    CallHook,
    add_hook,
    api,
    family_op,
    refresh_hooks,
    register_env_hook,
    registered_ops,
    remove_hook,
)
from flashtune.schema.core import (
    BoundCall,
    Const,
    OpSchema,
    Scalar,
    Tensor,
    Var,
    constant_mismatches,
    dtype_name,
    reference_constants,
)

__all__ = [
    "NOT_HANDLED",
    "REGISTRY",
    "ApiOp",
    "BoundCall",
    "CallHook",
    "Const",
    "OpSchema",
    "Scalar",
    "Tensor",
    "Var",
    "add_hook",
    "api",
    "constant_mismatches",
    "dtype_name",
    "reference_constants",
    "refresh_hooks",
    "register_env_hook",
    "family_op",
    "registered_ops",
    "remove_hook",
]
