#!/usr/bin/env bash
# librdkafka's own test suite against luxun's Kafka door (docs/librdkafka-suite.md).
#
#   scripts/librdkafka-suite.sh [options] LIBRDKAFKA_DIR [NNNN ...]
#
# LIBRDKAFKA_DIR: a librdkafka source tree (configured or not, built or not) or its
# tests/ directory. Nothing is fetched: the tree must be there. The test runner is
# built if it is not (./configure when unconfigured, make libs, make -C tests build).
# NNNN: test numbers to run (default: every "run" line of scripts/librdkafka-suite.list;
# a number named here runs even when the list skips it). Each test runs alone, with a
# timeout, against a luxun broker started for the run (one per test scenario) on free
# loopback ports with a fresh data directory.
#
# Options (environment variable in brackets):
#   --luxun DIR        luxun tree to serve from [LUXUN_TREE] (default: this script's tree)
#   --python PATH      python with luxun's dependencies [LUXUN_PYTHON] (default:
#                      DIR/.venv/bin/python, else python3)
#   --timeout S        seconds per test run before it is killed [SUITE_TIMEOUT] (900)
#   --logs DIR         where each test's output goes [SUITE_LOGS] (default: a new
#                      /tmp/librdkafka-suite.XXXXXX)
#   --kafka-version V  TEST_KAFKA_VERSION [TEST_KAFKA_VERSION] (4.0.0)
#   --quick            the runner's quick mode (-Q: fewer messages, fewer sub-tests)
#   --list FILE        the test list [SUITE_LIST] (default: next to this script)
#
# Prints one line per test and "N passed, M failed, K skipped"; exits 1 when a test
# failed, 2 on a usage or setup error.
set -u -o pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
luxun=${LUXUN_TREE:-$(dirname "$here")}
python=${LUXUN_PYTHON:-}
timeout_s=${SUITE_TIMEOUT:-900}
logs=${SUITE_LOGS:-}
kafka_version=${TEST_KAFKA_VERSION:-4.0.0}
quick=
list=${SUITE_LIST:-$here/librdkafka-suite.list}

usage() { sed -n '2,27p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
die() { echo "librdkafka-suite: $*" >&2; exit 2; }

args=()
while (($#)); do
    case $1 in
        --luxun) luxun=${2:?--luxun needs a directory}; shift 2 ;;
        --python) python=${2:?--python needs a path}; shift 2 ;;
        --timeout) timeout_s=${2:?--timeout needs seconds}; shift 2 ;;
        --logs) logs=${2:?--logs needs a directory}; shift 2 ;;
        --kafka-version) kafka_version=${2:?--kafka-version needs a version}; shift 2 ;;
        --quick) quick=-Q; shift ;;
        --list) list=${2:?--list needs a file}; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        --) shift; args+=("$@"); break ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) args+=("$1"); shift ;;
    esac
done
((${#args[@]})) || { usage >&2; exit 2; }
rdk=${args[0]}
wanted=("${args[@]:1}")

# -- the librdkafka tree ------------------------------------------------------------
[[ -d $rdk && -f $rdk/test.c && -f $rdk/../src/rdkafka.h ]] && rdk=$rdk/..
[[ -f $rdk/src/rdkafka.h && -f $rdk/tests/test.c && -x $rdk/configure ]] ||
    die "needs a librdkafka source tree (with src/rdkafka.h, tests/test.c and configure, e.g. git archive v2.15.0 of confluentinc/librdkafka): $rdk is not one"
rdk=$(cd "$rdk" && pwd)
[[ $timeout_s =~ ^[0-9]+$ && $timeout_s -gt 0 ]] || die "--timeout must be a positive number of seconds, not $timeout_s"
[[ -f $list ]] || die "no test list at $list"
[[ -f $luxun/luxun/cli.py ]] || die "--luxun $luxun is not a luxun tree (no luxun/cli.py)"
luxun=$(cd "$luxun" && pwd)
if [[ -z $python ]]; then
    if [[ -x $luxun/.venv/bin/python ]]; then python=$luxun/.venv/bin/python; else python=python3; fi
fi
"$python" -c 'import thriftpy2, kio' 2>/dev/null ||
    die "$python lacks luxun's dependencies (thriftpy2, kio): name the right one with --python or LUXUN_PYTHON"
command -v timeout >/dev/null || die "needs coreutils' timeout"

if [[ ! -x $rdk/tests/test-runner ]]; then
    echo "building librdkafka's test runner in $rdk (output: $rdk/suite-build.log)"
    (
        cd "$rdk" || exit 1
        if [[ ! -f Makefile.config ]]; then nice ./configure || exit 1; fi
        nice make -j2 libs && nice make -j2 -C tests build
    ) >"$rdk/suite-build.log" 2>&1 || die "building failed: see $rdk/suite-build.log"
fi
runner_dir=$rdk/tests

if [[ -z $logs ]]; then
    logs=$(mktemp -d /tmp/librdkafka-suite.XXXXXX)
else
    mkdir -p "$logs" || die "cannot make $logs"
fi
logs=$(cd "$logs" && pwd)

# -- the list -------------------------------------------------------------------------
# Each entry: "NNNN kind scenario subtests reason", joined by US (\x1f: not blank, so
# read keeps the empty fields).
entries=()
while read -r num kind rest; do
    [[ -z $num || $num == \#* ]] && continue
    scenario=default subtests='' reason=''
    if [[ $kind == run ]]; then
        for word in $rest; do
            case $word in
                scenario=*) scenario=${word#scenario=} ;;
                subtests=*) subtests=${word#subtests=} ;;
                *) die "$list: unknown word '$word' on the line of $num" ;;
            esac
        done
    else
        reason=$rest
    fi
    entries+=("$num"$'\x1f'"$kind"$'\x1f'"$scenario"$'\x1f'"$subtests"$'\x1f'"$reason")
done <"$list"

todo=()
skipped=()
if ((${#wanted[@]})); then
    for num in "${wanted[@]}"; do
        [[ $num =~ ^[0-9]{4}$ ]] || die "a test is named by its 4-digit number, not '$num'"
        found=
        for e in "${entries[@]}"; do
            IFS=$'\x1f' read -r n kind scenario subtests reason <<<"$e"
            [[ $n == "$num" ]] || continue
            found=1
            if [[ $kind == run ]]; then todo+=("$e"); else todo+=("$n"$'\x1f'run$'\x1f'default$'\x1f\x1f'); fi
        done
        [[ -n $found ]] || todo+=("$num"$'\x1f'run$'\x1f'default$'\x1f\x1f')
    done
else
    for e in "${entries[@]}"; do
        IFS=$'\x1f' read -r n kind scenario subtests reason <<<"$e"
        if [[ $kind == run ]]; then todo+=("$e"); elif [[ $kind == skip ]]; then skipped+=("$n: $reason"); fi
    done
fi

# -- brokers: one per scenario, started on first use ----------------------------------
declare -A broker_pid
cleanup() {
    local s
    for s in "${!broker_pid[@]}"; do
        kill "${broker_pid[$s]}" 2>/dev/null && wait "${broker_pid[$s]}" 2>/dev/null
    done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_ports() {  # two free loopback TCP ports, one a line
    "$python" - <<'EOF'
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print("\n".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
EOF
}

start_broker() {  # start_broker SCENARIO: sets broker_pid/broker_port[SCENARIO]
    local scenario=$1 dir=$logs/broker-$1 ports autocreate=true
    [[ $scenario == noautocreate ]] && autocreate=false
    mkdir -p "$dir"
    rm -rf "$dir/data"
    # What librdkafka's trivup cluster gives the suite (tests/scenarios/*.json and
    # Kafka's defaults), in luxun's keys.
    cat >"$dir/server.properties" <<EOF
num.partitions=4
auto.create.topics.enable=$autocreate
delete.topic.enable=true
group.initial.rebalance.delay.ms=3000
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=true
EOF
    mapfile -t ports < <(free_ports)
    (cd "$luxun" && PYTHONPATH=$luxun exec "$python" -m luxun serve \
        --config "$dir/server.properties" --data-dir "$dir/data" --host 127.0.0.1 \
        --port "${ports[0]}" --metrics-port 0 --kafka-port "${ports[1]}" \
        >>"$dir/broker.log" 2>&1) &
    broker_pid[$scenario]=$!
    local i
    for ((i = 0; i < 200; i++)); do
        kill -0 "${broker_pid[$scenario]}" 2>/dev/null ||
            die "the $scenario broker exited: see $dir/broker.log"
        if (exec 3<>"/dev/tcp/127.0.0.1/${ports[1]}") 2>/dev/null; then
            printf 'bootstrap.servers=127.0.0.1:%s\ntest.timeout.multiplier=3\n' "${ports[1]}" >"$dir/test.conf"
            echo "broker ($scenario): luxun from $luxun on Kafka port ${ports[1]}, log $dir/broker.log"
            return 0
        fi
        sleep 0.1
    done
    die "the $scenario broker did not listen within 20 s: see $dir/broker.log"
}

ensure_broker() {  # a live broker for SCENARIO (restarted, with a note, if it died)
    local scenario=$1
    if [[ -n ${broker_pid[$scenario]:-} ]]; then
        kill -0 "${broker_pid[$scenario]}" 2>/dev/null && return 0
        echo "note: the $scenario broker had exited (see $logs/broker-$scenario/broker.log); starting it again"
        wait "${broker_pid[$scenario]}" 2>/dev/null
    fi
    start_broker "$scenario"
}

# -- running one test -------------------------------------------------------------------
# run_once NUM SCENARIO SUBTEST LOG: 0 passed, 1 failed, 3 skipped by the runner.
run_once() {
    local num=$1 scenario=$2 subtest=$3 log=$4 rc
    ensure_broker "$scenario"
    { (
        cd "$runner_dir" || exit 1
        export LD_LIBRARY_PATH=$rdk/src:$rdk/src-cpp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        export RDKAFKA_TEST_CONF=$logs/broker-$scenario/test.conf
        export TEST_KAFKA_VERSION=$kafka_version TESTS=$num
        if [[ -n $subtest ]]; then export SUBTESTS=$subtest; else unset SUBTESTS; fi
        unset TESTS_SKIP TESTS_SKIP_BEFORE KAFKA_PATH CI
        # shellcheck disable=SC2086 # $quick is one flag or nothing
        exec timeout -k 10 "$timeout_s" ./test-runner -L -s "$scenario" $quick
    ) >"$log" 2>&1; } 2>/dev/null # keeps bash's note of a runner killed by a signal out
    rc=$?
    if ((rc == 124 || rc == 137)); then
        echo "### killed after the per-test timeout of $timeout_s s ###" >>"$log"
        return 1
    fi
    ((rc != 0)) && return 1
    # The runner exits 0 also when a test of a known issue failed: read its summary.
    local summary
    summary=$(sed 's/\x1b\[[0-9;]*m//g; s/\x1b(B//g' "$log" | grep -E "^\| *${num}_[^ |]* *\| *[A-Z]+ *\|")
    if grep -q '| *FAILED *|' <<<"$summary"; then return 1; fi
    if grep -q '| *PASSED *|' <<<"$summary"; then return 0; fi
    if grep -q '| *SKIPPED *|' <<<"$summary"; then return 3; fi
    echo "### no result for test $num in the runner's summary ###" >>"$log"
    return 1
}

first_failure() {  # the first failing assertion in LOG, on one line
    local log=$1 line
    line=$(sed 's/\x1b\[[0-9;]*m//g; s/\x1b(B//g' "$log" | awk '
        /### Test ".*" failed at / {
            where = $0; sub(/.* failed at /, "", where); sub(/\(\) at .*/, "()", where)
            getline msg; print where ": " msg; exit
        }
        /### killed after the per-test timeout|### no result for test/ { print; exit }')
    [[ -n $line ]] || line="the runner failed without an assertion, see $log"
    printf '%s' "${line:0:300}"
}

passed=0 failed=0 skipped_n=0
failed_list=()
echo "librdkafka $(sed -n 's/^#define RD_KAFKA_VERSION *0x\(..\)\(..\)\(..\).*/\1.\2.\3/p' "$rdk/src/rdkafka.h" |
    awk -F. '{printf "%d.%d.%d", "0x"$1, "0x"$2, "0x"$3}') from $rdk; TEST_KAFKA_VERSION=$kafka_version${quick:+, quick mode}; logs in $logs"
for e in "${todo[@]}"; do
    IFS=$'\x1f' read -r num kind scenario subtests reason <<<"$e"
    label=$num
    [[ $scenario != default ]] && label="$num@$scenario"
    name=$num
    for f in "$runner_dir/$num"-*.c "$runner_dir/$num"-*.cpp; do
        if [[ -f $f ]]; then name=$(basename "${f%.*}"); break; fi
    done
    [[ $scenario != default ]] && name="$name@$scenario"
    start=$(date +%s.%N)
    status=0 why='' parts=()
    if [[ -n $subtests ]]; then IFS=, read -r -a parts <<<"$subtests"; else parts=(""); fi
    n_skip=0 failed_parts=()
    for part in "${parts[@]}"; do
        log=$logs/$label${part:+-${part//[^A-Za-z0-9_]/}}.log
        run_once "$num" "$scenario" "$part" "$log"
        rc=$?
        if ((rc == 1)); then
            status=1
            [[ -n $part ]] && failed_parts+=("${part%:}")
            [[ -n $why ]] || why=$(first_failure "$log")
        elif ((rc == 3)); then
            n_skip=$((n_skip + 1))
        fi
    done
    secs=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {printf "%.1f", e - s}')
    if ((status)); then
        failed=$((failed + 1))
        failed_list+=("$label")
        if ((${#failed_parts[@]})); then why="[${failed_parts[*]} of ${#parts[@]} runs] $why"; fi
        echo "$name ... failed: $why ($secs s)"
    elif ((n_skip == ${#parts[@]})); then
        skipped_n=$((skipped_n + 1))
        why=$(sed 's/\x1b\[[0-9;]*m//g; s/\x1b(B//g' "$log" | grep -E "^\| *${num}_[^ |]* *\| *SKIPPED" | grep -v -m1 'negative test flags' | sed -E 's/^.*\| *//')
        echo "$name ... skipped by the runner: ${why:-see $log} ($secs s)"
    else
        passed=$((passed + 1))
        echo "$name ... passed ($secs s)"
    fi
done
for s in "${skipped[@]}"; do
    echo "${s%%:*} ... skipped:${s#*:}"
done
skipped_n=$((skipped_n + ${#skipped[@]}))
echo "$passed passed, $failed failed, $skipped_n skipped"
((failed)) && echo "failed: ${failed_list[*]} (logs in $logs)"
((failed == 0))
