"""The math: sympy derivations of the bounds, activation properties, the seed papers' claims, the swap certificate."""
