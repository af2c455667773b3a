"""DALI integration: external sources fed by fastread's native readers.

``fastread.dali.readers.file`` is a drop-in for ``fn.readers.file``::

    from fastread.dali import readers

    @pipeline_def(batch_size=256, num_threads=8, device_id=0)
    def pipe():
        jpegs, labels = readers.file(file_root="/data/train", random_shuffle=True)
        return fn.decoders.image(jpegs, device="mixed"), labels
"""
from fastread.dali import readers

__all__ = ["readers"]
