/* sim_fault.c - random partitions and crashes of the simulated network
 * (ferry_sim_opts.partition_every, crash_every), drawn from the
 * simulation's seed.
 * Loop thread only.
 *
 * Each kind is one timer of the loop that alternates: the fault, then
 * its end (the heal, the restart) after a time drawn from the seed, then
 * the next fault.  A fault is armed only while it can hit something
 * (partitions while connections are open, crashes while a host has
 * tasks), so that an idle simulation leaves the virtual clock still; the
 * calls that open a connection or spawn a host's task arm it again.  The
 * draws happen when a timer fires or is armed, so they follow the
 * program's own order of events and replay with the seed.
 */
#include "loop_only.h"

#include "rand.h"
#include "sim_int.h"

/* A time between 0 and twice `mean`, drawn from the seed. */
static int64_t draw(struct ferry_sim *sim, int64_t mean)
{
    return (int64_t)(ferry__rand_next(&sim->rng) % (2 * (uint64_t)mean + 1));
}

static void arm(struct ferry_sim *sim, struct ferry__hnode *n, int64_t after)
{
    ferry__heap_insert(&sim->loop->timers, n, ferry__loop_now(sim->loop) + after);
    ferry__loop_timers_changed(sim->loop);
}

static int64_t since(const struct ferry_sim *sim)
{
    return ferry__loop_now(sim->loop) - sim->start;
}

/* ---- partitions ---------------------------------------------------------------- */

/* Cut the hosts into two sets drawn from the seed, neither empty.
 * Returns false with fewer than two hosts. */
static bool cut_at_random(struct ferry_sim *sim)
{
    struct ferry__link *l;
    uint32_t count = 0, ones = 0, pick;

    ferry__list_foreach(l, &sim->hosts)
        count++;
    if (count < 2)
        return false;
    ferry__sim_heal_now(sim);
    ferry__list_foreach(l, &sim->hosts) {
        ferry_sim_host *h = ferry__container_of(l, ferry_sim_host, link);
        h->side = 1 + (int)(ferry__rand_next(&sim->rng) >> 63);
        ones += h->side == 1;
    }
    if (ones == 0 || ones == count) {
        /* All on one side: one host drawn from the seed crosses over. */
        pick = ferry__rand_below(&sim->rng, count);
        ferry__list_foreach(l, &sim->hosts) {
            ferry_sim_host *h = ferry__container_of(l, ferry_sim_host, link);
            if (pick-- == 0) {
                h->side = 3 - h->side;
                break;
            }
        }
    }
    ferry__sim_parted(sim, "random");
    return true;
}

static void part_fire(struct ferry__hnode *n)
{
    struct ferry_sim *sim = ferry__container_of(n, struct ferry_sim, part_node);

    if (sim->part_random) {
        sim->part_random = false;
        ferry__sim_heal_now(sim);
        ferry__sim_faults_arm(sim);
        return;
    }
    if (sim->parted) {
        /* A partition on command is in place: it stays until healed on
         * command; draw the next random one. */
        ferry__sim_faults_arm(sim);
        return;
    }
    if (cut_at_random(sim)) {
        sim->part_random = true;
        arm(sim, &sim->part_node, draw(sim, sim->partition_for));
    }
}

void ferry__sim_part_forget(struct ferry_sim *sim)
{
    if (!sim->part_random)
        return;
    sim->part_random = false;
    if (sim->part_node.linked)
        ferry__heap_remove(&sim->loop->timers, &sim->part_node);
}

/* ---- crashes -------------------------------------------------------------------- */

/* A host that a random crash may hit: up, with tasks. */
static bool crashable(struct ferry_sim *sim, const ferry_sim_host *h)
{
    return !h->crashed && ferry__sim_host_busy(sim, h);
}

static void crash_fire(struct ferry__hnode *n)
{
    struct ferry_sim *sim = ferry__container_of(n, struct ferry_sim, crash_node);
    ferry_sim_host *down = sim->crash_down;
    struct ferry__link *l;
    uint32_t count = 0, pick;

    if (down) {
        sim->crash_down = NULL;
        ferry__sim_trace(sim, "%lld %s restart random\n", (long long)since(sim), down->name);
        ferry_sim_restart(sim, down);
        ferry__sim_faults_arm(sim);
        return;
    }
    ferry__list_foreach(l, &sim->hosts)
        count += crashable(sim, ferry__container_of(l, ferry_sim_host, link));
    if (!count)
        return;
    pick = ferry__rand_below(&sim->rng, count);
    ferry__list_foreach(l, &sim->hosts) {
        ferry_sim_host *h = ferry__container_of(l, ferry_sim_host, link);
        if (crashable(sim, h) && pick-- == 0) {
            ferry__sim_trace(sim, "%lld %s crash random\n", (long long)since(sim), h->name);
            ferry_sim_crash(sim, h);
            sim->crash_down = h;
            arm(sim, &sim->crash_node, draw(sim, sim->crash_for));
            return;
        }
    }
}

void ferry__sim_faults_arm(struct ferry_sim *sim)
{
    struct ferry__link *l;

    ferry__sim_chaos_arm(sim);
    if (sim->partition_every && !sim->part_node.linked && ferry__sim_any_live(sim)) {
        sim->part_node.fire = part_fire;
        arm(sim, &sim->part_node, draw(sim, sim->partition_every));
    }
    if (sim->crash_every && !sim->crash_node.linked) {
        ferry__list_foreach(l, &sim->hosts) {
            if (crashable(sim, ferry__container_of(l, ferry_sim_host, link))) {
                sim->crash_node.fire = crash_fire;
                arm(sim, &sim->crash_node, draw(sim, sim->crash_every));
                break;
            }
        }
    }
}
