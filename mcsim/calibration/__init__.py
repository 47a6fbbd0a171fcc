"""Step times against measured GPUs: readers of measured operation times and (``mcsim calibrate``) fits of the
roofline's free parameters to them."""
