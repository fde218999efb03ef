"""Training and evaluation data: the DummyDataset, Natural Questions reading, windows and the feature cache.

Kept free of imports: featurising processes import ``distqa.data.cache`` and should start light.
"""
