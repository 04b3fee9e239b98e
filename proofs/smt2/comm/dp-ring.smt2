; placement-logic proof obligation: comm/dp-ring
; theorem: Communication derivation
; DP ring bytes = 2(N − 1)/N · 2Ψ
;   ∀ Ψ > 0, N ∈ ℤ, N ≥ 1: comm(DP) = 2(N − 1)/N · 2Ψ  (ring all-reduce of the fp16 gradient)
; the assertions are the NEGATION of the statement:
;   expected unsat (statement proved)
(set-logic ALL)
(set-info :status unsat)
(declare-fun N () Int)
(declare-fun psi () Real)
(assert
 (let ((?x0 (to_real N)))
 (<= 1.0 ?x0)))
(assert
 (< 0.0 psi))
(assert
 (let ((?x0 (to_real N)))
 (and (distinct ?x0 0.0) true)))
(assert
 (let ((?x0 (to_real N)))
 (and (distinct ?x0 0.0) true)))
(assert
 (let ((?x1 (* (* (* 2.0 psi) (/ 1.0 (to_real N))) (+ (- 2.0) (* 2.0 (to_real N))))))
(not (= ?x1 ?x1))))
(check-sat)
(exit)
