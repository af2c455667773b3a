/* engine="auto"'s timed trials in the band where both engines run close
 * (see auto_trial.h). */
#include "auto_trial.h"

#include "fastread.h"

static int other(int engine)
{
    return engine == FR_AUTO_PSYNC ? FR_AUTO_URING : FR_AUTO_PSYNC;
}

void fr_auto_trial_reset(fr_auto_trial *t, int start)
{
    for (int e = 0; e < 2; e++) {
        t->ns_per_byte[e] = 0;
        t->timed[e] = 0;
    }
    t->keep = start;
    t->last = -1;
    t->since = 0;
    t->left = 0;
    t->tried = 0;
}

int fr_auto_trial_pick(fr_auto_trial *t)
{
    if (t->left == 0) {
        unsigned due = t->tried ? FR_AUTO_TRIAL_EVERY : FR_AUTO_TRIAL_FIRST;
        if (t->since < due) {
            t->since++;
            return t->keep;
        }
        /* A trial starts. The other engine's old timing is stale: the files
         * and the machine's load may have changed since. */
        int o = other(t->keep);
        t->ns_per_byte[o] = 0;
        t->timed[o] = 0;
        t->since = 0;
        t->left = FR_AUTO_TRIAL_BATCHES;
        t->tried = 1;
        t->trials++;
    }
    return other(t->keep);
}

void fr_auto_trial_record(fr_auto_trial *t, int engine, uint64_t bytes, long ns)
{
    if (engine == t->last && bytes > 0 && ns > 0) {
        /* The first timed batches count equally, later ones as a running
         * mean: a trial's two timed batches are averaged, not weighted. */
        double x = (double)ns / (double)bytes, *mean = &t->ns_per_byte[engine];
        double w = 1.0 / (double)++t->timed[engine];
        if (w < FR_AUTO_TRIAL_WEIGHT)
            w = FR_AUTO_TRIAL_WEIGHT;
        *mean += w * (x - *mean);
    }
    t->last = engine;
    if (t->left > 0 && engine != t->keep && --t->left == 0) {
        double kept = t->ns_per_byte[t->keep], tried = t->ns_per_byte[engine];
        if (kept > 0 && tried > 0 && tried < kept * (1.0 - FR_AUTO_TRIAL_MARGIN)) {
            t->keep = engine;
            t->switches++;
        }
    }
}
