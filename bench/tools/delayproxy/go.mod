module fastread/bench/delayproxy

go 1.21
