"""Public functions: NumPy arrays (``arrays``) and Zarr stores."""
