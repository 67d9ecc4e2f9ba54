"""Drawing the calibration views: standalone SVG and HTML (no dependency; notebooks'
``_repr_html_``) in :mod:`qstream.viz.svg` and :mod:`qstream.viz.html`, matplotlib figures in
:mod:`qstream.viz.mpl` (``pip install 'qstream-zarr[plot]'``, imported only when a plot is asked
for). The data they draw is in :mod:`qstream.calibration.views`."""
