"""The built-in model zoo: small ONNX models the harness can build itself.

``digits_cnn`` is a convolutional classifier trained in numpy on scikit-learn's
bundled digits data set, so its accuracy can be checked against real labels.
"""
