"""Names shared by every step's kernel."""

import math

import cuda.tile as ct

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

# exp(x) == exp2(x * log2(e)): the factor that moves the softmax scale into base 2.
INV_LOG_2 = 1.0 / math.log(2)
LN_2 = math.log(2)  # and back: natural log == log2 * ln(2)
