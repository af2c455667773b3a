import re,collections,statistics,sys
r=collections.defaultdict(dict)
for line in open(sys.argv[1]):
    m=re.match(r'round (\d+): (\S+)\s+(\d+) img/s.*cpu ([\d.]+)(?: s)? user ([\d.]+)(?: s)? sys',line)
    if m: r[int(m.group(1))][m.group(2)]=(int(m.group(3)),float(m.group(4)),float(m.group(5)))
modes=list(r[0])
for m in modes:
    ks=sorted(k for k in r if m in r[k])
    pct=[100*r[k][m][0]/r[k]['parquet-files-ceiling'][0] for k in ks]
    print(f"{m:34s} rates {[r[k][m][0] for k in ks]} pct {[round(p) for p in pct]} median {statistics.median(r[k][m][0] for k in ks):.0f} median-pct {statistics.median(pct):.0f} cpu {statistics.median(r[k][m][1] for k in ks):.2f}+{statistics.median(r[k][m][2] for k in ks):.2f}")
for a,b in (('parquet-reader-idxwarm','parquet-reader-idxcold'),('parquet-reader-fileorder-idxwarm','parquet-reader-fileorder-idxcold')):
    x=[r[k][a][0]/r[k][b][0] for k in sorted(r)]
    print(a,'/',b,[round(v,2) for v in x],'median',round(statistics.median(x),2))
