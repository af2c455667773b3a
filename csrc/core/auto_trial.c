/* engine="auto"'s timed trials in the band where both engines run close
 * (see auto_trial.h). */
#include "core/auto_trial.h"

#include "fastread.h"

static int other(int engine)
{
    return engine == FR_AUTO_PSYNC ? FR_AUTO_URING : FR_AUTO_PSYNC;
}

/* The median of an engine's recent timed batches; 0 if none. */
static double recent_median(const fr_auto_trial *t, int engine)
{
    unsigned n = t->timed[engine] < FR_AUTO_TRIAL_RECENT ? t->timed[engine] : FR_AUTO_TRIAL_RECENT;
    double v[FR_AUTO_TRIAL_RECENT];
    for (unsigned i = 0; i < n; i++) { /* insertion sort: a handful of values */
        double x = t->recent[engine][i];
        unsigned j = i;
        for (; j > 0 && v[j - 1] > x; j--)
            v[j] = v[j - 1];
        v[j] = x;
    }
    if (n == 0)
        return 0;
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void fr_auto_trial_reset(fr_auto_trial *t, int start)
{
    t->timed[0] = t->timed[1] = 0;
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
        t->timed[other(t->keep)] = 0;
        t->since = 0;
        t->left = FR_AUTO_TRIAL_BATCHES;
        t->tried = 1;
        t->trials++;
    }
    return other(t->keep);
}

void fr_auto_trial_record(fr_auto_trial *t, int engine, uint64_t bytes, long ns)
{
    if (engine == t->last && bytes > 0 && ns > 0)
        t->recent[engine][t->timed[engine]++ % FR_AUTO_TRIAL_RECENT] = (double)ns / (double)bytes;
    t->last = engine;
    if (t->left > 0 && engine != t->keep && --t->left == 0) {
        double kept = recent_median(t, t->keep), tried = recent_median(t, engine);
        if (kept > 0 && tried > 0 && tried < kept * (1.0 - FR_AUTO_TRIAL_MARGIN)) {
            t->keep = engine;
            t->switches++;
        }
    }
}
