"""What a run gives back (``result``: the data, which imports no presentation),
its ``stats``, its ``summary`` rows, its ``report`` (plots, HTML), what it
``record``s of its episodes and their ``video``s."""
