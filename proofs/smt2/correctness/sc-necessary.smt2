; placement-logic proof obligation: correctness/sc-necessary
; theorem: Correctness
; SC is necessary: GI alone does not give equivalence
;   statement refuted: the plan (ZeRO-1 that never all-gathers the updated parameters after the sharded optimizer step), which satisfies GI, is equivalent to single-device training under one SGD step θ' = θ − ĝ, at sizes dp = 2, microbatches = 2
; the assertions are the NEGATION of the statement:
;   expected sat (witness exists)
(set-logic ALL)
(set-info :status sat)
(declare-fun N_0_0 () Int)
(declare-fun N_0_1 () Int)
(declare-fun N_1_0 () Int)
(declare-fun N_1_1 () Int)
(declare-fun X_1_1 () Real)
(declare-fun X_1_0 () Real)
(declare-fun X_0_1 () Real)
(declare-fun X_0_0 () Real)
(declare-fun theta () Real)
(assert
 (>= N_0_0 1))
(assert
 (>= N_0_1 1))
(assert
 (>= N_1_0 1))
(assert
 (>= N_1_1 1))
(assert
 (<= N_0_0 4))
(assert
 (<= N_0_1 4))
(assert
 (<= N_1_0 4))
(assert
 (<= N_1_1 4))
(assert
 (= N_0_0 1))
(assert
 (= N_0_1 1))
(assert
 (= N_1_0 1))
(assert
 (= N_1_1 1))
(assert
 (let ((?x0 (to_real N_1_1)))
(let ((?x1 (to_real N_1_0)))
(let ((?x2 (+ (+ (+ (+ 0.0 (to_real N_0_0)) (to_real N_0_1)) ?x1) ?x0)))
(let ((?x3 (- theta (/ (+ (+ (+ (+ 0.0 X_0_0) X_0_1) X_1_0) X_1_1) ?x2))))
(let ((?x4 (+ (+ (+ 0.0 (/ X_0_0 ?x2)) (/ X_0_1 ?x2)) (/ X_1_0 ?x2))))
(let (($x0 (and (distinct (- theta (/ (* (+ ?x4 (/ X_1_1 ?x2)) 1.0) 1.0)) ?x3) true)))
(or $x0 (and (distinct theta ?x3) true)))))))))
(check-sat)
(exit)
