/*
 * engine="auto"'s measured choice for batches of cached files of
 * FR_AUTO_MIN_SIZE or more ("the band"), on any machine.
 *
 * There the two engines run close, and which one wins changes between runs
 * of the same benchmark on the same machine: on the 16-core H200, 1 MiB
 * files read by read_files() in lists of 64 went 0.96-1.12x as fast with
 * io_uring as with psync over seven runs (lists of 256: 0.84-0.94x; the
 * engines-warm JSON files under docs/results/h200-2026...), so a fixed
 * rule left auto at 0.87-0.97 of the better engine in that cell; on the
 * 2-core VM, where the rule says io_uring, psync read them 1.03-1.31x as
 * fast in one run (docs/results/engines-2core-20261127). So in the band
 * auto times both: it reads with the rule's pick for the machine
 * (fr_auto_rule: psync on FR_AUTO_MIN_CPUS or more CPUs, else io_uring),
 * and after FR_AUTO_TRIAL_FIRST batches in the band, then every
 * FR_AUTO_TRIAL_EVERY, reads FR_AUTO_TRIAL_BATCHES with the other engine.
 * A batch's time is the engine call's, per byte read; the first batch after each switch is not timed
 * (the pool it switches to wakes its helpers). After a trial it keeps
 * whichever engine read faster per byte, by the median of each engine's
 * last FR_AUTO_TRIAL_RECENT timed batches, switching only for a lead of
 * more than FR_AUTO_TRIAL_MARGIN. Medians, because one slow batch must not
 * decide: with running means, a context's first batches of 1 MiB files
 * (its arenas still faulting in) made psync look slower, and the first
 * trial moved read_files() lists of 256 to io_uring, the slower engine
 * there (0.95 of psync, H200).
 *
 * Pure bookkeeping, no clock and no I/O: the context times the batches and
 * says when the band was left (fr_auto_trial_reset). One per context, used
 * by its calling thread only; not thread-safe.
 */
#ifndef FASTREAD_AUTO_TRIAL_H
#define FASTREAD_AUTO_TRIAL_H

#include <stdint.h>

/* Band batches before the first trial. Each of a Reader's workers has its
 * own context and trials: in bench/engines/engines.py's cell of 2,000 1 MiB files
 * in batches of 256 (~11 epochs in 0.5 s on the H200), each of 8 workers
 * reads ~11 batches, and with 8 here its last 3 went to the slower engine
 * (auto 0.95 of psync). Later, the trial also times arenas that are done
 * faulting in. */
#define FR_AUTO_TRIAL_FIRST 16u
#define FR_AUTO_TRIAL_EVERY 128u /* band batches between trials after it */
#define FR_AUTO_TRIAL_BATCHES 4u /* a trial's batches, its first untimed */
#define FR_AUTO_TRIAL_RECENT 3u  /* timed batches of each engine compared */
/* The lead a trial needs to switch: issue 16 asks auto for 5% of the best
 * engine, and 1 MiB cells vary by about that between rounds (H200); with
 * 3%, a context reading 1 MiB lists of 64, where the engines ran 2-5%
 * apart, switched 3 times in 7 trials and read at 0.91-0.96 of io_uring. */
#define FR_AUTO_TRIAL_MARGIN 0.05

typedef struct fr_auto_trial {
    /* By engine (FR_AUTO_URING, FR_AUTO_PSYNC): ns a byte of its last timed
     * batches, timed[e] of them so far (a ring of the last RECENT). */
    double recent[2][FR_AUTO_TRIAL_RECENT];
    unsigned timed[2];
    int keep;              /* the engine kept between trials */
    int last;              /* the engine of the last batch recorded; -1: none */
    unsigned since;        /* batches picked since the last trial ended */
    unsigned left;         /* batches of the trial in progress still to record */
    int tried;             /* a trial started since the last reset */
    long trials;           /* trials run */
    long switches;         /* trials that changed the kept engine */
} fr_auto_trial;

/* Forgets every timing: the band was left, or the data set changed. The
 * engine kept at first is `start` (the rule's pick). The counters (trials,
 * switches) stay; zero the struct before the first reset. */
void fr_auto_trial_reset(fr_auto_trial *t, int start);

/* The engine for the next batch in the band. */
int fr_auto_trial_pick(fr_auto_trial *t);

/* After a batch picked in the band: `engine` read `bytes` in `ns` (a failed
 * call: 0 bytes). A batch right after a switch, or of no bytes, is not
 * timed. A trial's last batch ends it: the faster engine is kept. */
void fr_auto_trial_record(fr_auto_trial *t, int engine, uint64_t bytes, long ns);

#endif
