"""The conversion step's transforms, one module each: shapes, freezing, folding, constants, opset,
rewrites, and the equivalence check every transform must pass (harness.steps.conversion runs them)."""
