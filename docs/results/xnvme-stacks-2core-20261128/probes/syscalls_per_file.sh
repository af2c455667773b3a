# Syscalls per file of one engine: strace -c -f reading N1 and N2 files, the
# difference over N2 - N1.  bash syscalls_per_file.sh PYTHON ENGINE ASYNC N1 N2
py=$1; eng=$2; a=$3; n1=$4; n2=$5
for n in $n1 $n2; do strace -f -c -o /tmp/sc-$eng-$a-$n.txt $py "$(dirname "$0")/read_4k.py" $eng $a $n; done
python3 - "$eng" "$a" $n1 $n2 <<'P'
import sys, re
eng,a,n1,n2=sys.argv[1],sys.argv[2],int(sys.argv[3]),int(sys.argv[4])
def load(n):
    d={}
    for l in open(f"/tmp/sc-{eng}-{a}-{n}.txt"):
        f=l.split()
        if len(f)>=5 and f[0][0].isdigit() and f[-1]!="total":
            d[f[-1]]=int(f[3])
    return d
d1,d2=load(n1),load(n2)
per={k:(d2.get(k,0)-d1.get(k,0))/(n2-n1) for k in set(d1)|set(d2)}
per={k:v for k,v in per.items() if v>=0.05}
tot=sum(per.values())
print(f"{eng:10} {a:8} {tot:5.1f} syscalls/file: "+", ".join(f"{k} {v:.2f}" for k,v in sorted(per.items(), key=lambda x:-x[1])))
P
