import os
import sys

# `import attn` from the build tree (ctest sets ATTN_PYTHONPATH; default build/python).
_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.environ.get("ATTN_PYTHONPATH",
                                  os.path.join(_here, "..", "..", "build", "python")))
