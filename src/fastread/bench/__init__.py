"""``fastread bench``: read throughput of fastread against DALI's readers and
plain Python, over one dataset, on this machine.

Modules, bottom to top (each imports only those above it):

* :mod:`~fastread.bench.environment` -- what is installed and usable here;
* :mod:`~fastread.bench.registry` -- modes, families (found at run time in
  :mod:`fastread.bench.families`; the interface a family implements is
  documented there), datasets, selection;
* :mod:`~fastread.bench.baselines` -- the pure-Python readers fastread is
  measured against (the seed's ``np.fromfile`` loop, xNVMe's ctypes loop);
* :mod:`~fastread.bench.runners` -- runners (a DALI pipeline, a Reader, a
  loop) and the timing loop;
* :mod:`fastread.bench.families` -- one module per family of modes;
* :mod:`~fastread.bench.report` -- table, verdict, plot;
* :mod:`~fastread.bench.harness` -- the run itself (``fastread bench``);
* :mod:`~fastread.bench.sweep` -- ``python -m fastread.bench.sweep``, a
  queue-depth sweep of any modes.
* :mod:`~fastread.bench.interleaved` -- the pieces the interleaved-rounds
  scripts (``bench/dali/bench_native.py``, ``bench/dali/bench_image.py``,
  ``bench/dali/wds_native.py``) share: options, ``--modes``, the rounds, the report.

Nothing heavy (DALI, matplotlib) is imported until a mode runs.
"""
